"""Ablation suites: the shipped ones load into plans whose runs share one policy_0, and bad
input is refused with the field and the fix named."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.ablate.run import check_arm_runs, check_record, time_left
from flows.ablate.suites import load_suite, make_plan, suite_names
from flows.cli import main
from flows.errors import ConfigError
from storage.errors import ConfigMismatchError, StoreError
from storage.store import RunStore


def test_the_default_suite_has_the_papers_arms_at_three_seeds(tmp_path: Path) -> None:
    name, suite = load_suite("default")
    plan = make_plan(name, suite, seeds=None, ablation_id=None, store_root=tmp_path)
    assert plan.ablation_id == "ablate-default"
    runs = plan.arm_runs()
    assert {r.arm for r in runs} >= {"sft", "rft", "online_rft", "dpo", "grpo_os", "grpo_ps"}
    assert "grpo_os_rm_once" in suite.arms
    assert {r.seed for r in runs} == {0, 1, 2}
    policy_0 = plan.policy_0_dir()
    assert policy_0 == tmp_path / "checkpoints" / "ablate-default" / "policy" / "iter-0"
    for r in runs:  # every arm-seed run loads the shared policy_0 instead of warm-starting
        assert (r.config.policy.kind, r.config.policy.path) == ("local", str(policy_0))
        assert not r.config.run.warm_start
        assert r.run_id == f"ablate-default-{r.arm}-s{r.seed}"
    by_arm = {r.arm: r.config for r in runs if r.seed == 0}
    assert by_arm["grpo_ps"].grpo.algo.adv_estimator == "grpo_process"
    assert by_arm["dpo"].grpo.algo.estimator.pairs  # the DPO arm trains on the policy's pairs
    # Fig. 6: 3 iterations, the reward model retrained or trained once
    assert by_arm["grpo_os"].reward_models.retrain
    assert not by_arm["grpo_os_rm_once"].reward_models.retrain
    assert by_arm["grpo_os"].run.iterations == by_arm["grpo_os_rm_once"].run.iterations == 3
    # equal sampled outputs and update steps per iteration across the Fig. 5 arms
    fig5 = [by_arm[a] for a in ("sft", "rft", "online_rft", "dpo", "grpo_os", "grpo_ps")]
    shapes = {(c.grpo.steps, c.grpo.prompts_per_step, c.grpo.group_size) for c in fig5}
    assert len(shapes) == 1
    assert by_arm["grpo_os"].evaluation.k_values()[-1] == 64  # Fig. 7: K up to 64


def test_micro_suite_is_two_arms_by_two_seeds(tmp_path: Path) -> None:
    assert {"default", "micro"} <= set(suite_names())
    name, suite = load_suite("micro")
    plan = make_plan(name, suite, seeds=None, ablation_id="m", store_root=tmp_path)
    assert [(r.arm, r.seed) for r in plan.arm_runs()] == [
        ("grpo_os", 0),
        ("grpo_os", 1),
        ("online_rft", 0),
        ("online_rft", 1),
    ]


def test_the_ppo_suite_compares_ppo_dapo_and_grpo_at_the_same_budget(tmp_path: Path) -> None:
    name, suite = load_suite("ppo")
    plan = make_plan(name, suite, seeds=None, ablation_id=None, store_root=tmp_path)
    by_arm = {r.arm: r.config for r in plan.arm_runs() if r.seed == 0}
    assert set(by_arm) == {"grpo_os", "ppo", "dapo"} and suite.seeds == 3
    grpo, ppo, dapo = by_arm["grpo_os"], by_arm["ppo"], by_arm["dapo"]
    assert ppo.grpo.algo.estimator.needs_values and not grpo.grpo.algo.estimator.needs_values
    assert dapo.grpo.algo.dynamic_sampling and not grpo.grpo.algo.dynamic_sampling
    same = {
        (c.grpo.steps, c.grpo.prompts_per_step, c.grpo.group_size, c.grpo.algo.mu)
        for c in (grpo, ppo, dapo)
    }
    assert len(same) == 1 and grpo.grpo.rewards == ppo.grpo.rewards
    assert not dapo.reward_models.use_prm  # the learned ORM rewards every arm
    assert ppo.grpo.algo.ppo.kl_coef == grpo.grpo.algo.beta  # the same KL weight, moved


def test_the_staleness_suite_changes_only_how_far_the_sampler_lags(tmp_path: Path) -> None:
    name, suite = load_suite("staleness")
    plan = make_plan(name, suite, seeds=None, ablation_id=None, store_root=tmp_path)
    by_arm = {r.arm: r.config for r in plan.arm_runs() if r.seed == 0}
    lag = {arm: c.grpo.async_.max_staleness for arm, c in by_arm.items()}
    assert lag == {"sync": 0, "stale_1": 1, "stale_2": 2, "decoupled_1": 1}
    assert by_arm["decoupled_1"].grpo.algo.rollout_correction.on
    budgets = {(c.grpo.steps, c.grpo.prompts_per_step, c.grpo.group_size, c.run.num_threads)
               for c in by_arm.values()}  # fmt: skip
    assert len(budgets) == 1 and suite.seeds == 3


def test_unknown_suite_names_the_suites() -> None:
    with pytest.raises(
        ConfigError,
        match=r"--suite nope: unknown suite; suites: curriculum, default, distill, fig6, micro, "
        r"objectives",
    ):
        load_suite("nope")


def test_seeds_below_one_are_refused(tmp_path: Path) -> None:
    name, suite = load_suite("micro")
    with pytest.raises(ConfigError, match=r"--seeds must be >= 1 \(got 0\)"):
        make_plan(name, suite, seeds=0, ablation_id=None, store_root=tmp_path)


def test_an_arm_may_not_change_what_policy_0_is(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("config: micro\narms:\n  wide: [policy.hidden_size=64]\n")
    with pytest.raises(ConfigError, match=r"arms: .*arm 'wide' overrides policy.hidden_size"):
        load_suite(str(path))


def test_a_bad_arm_override_names_the_arm(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("config: micro\narms:\n  fast: [grpo.stepz=2]\n")
    name, suite = load_suite(str(path))
    with pytest.raises(ConfigError, match=r"suite 'typo', arm 'fast': invalid config"):
        make_plan(name, suite, seeds=1, ablation_id=None, store_root=tmp_path)


def test_cli_reports_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "s")
    assert main(["ablate", "--suite", "nope", "--store", store, "--no-prefect"]) == 2
    assert "itergrpo ablate: error: --suite nope: unknown suite" in capsys.readouterr().err
    assert main(["ablate", "--suite", "micro", "--seeds", "0", "--store", store]) == 2
    assert "--seeds must be >= 1 (got 0)" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_a_suite_changed_under_a_started_ablation_is_refused_before_any_work(
    tmp_path: Path,
) -> None:
    name, suite = load_suite("micro")
    plan = make_plan(name, suite, seeds=1, ablation_id=None, store_root=tmp_path)
    first = plan.arm_runs()[0]
    store = RunStore(tmp_path)
    with (
        store.open_run(first.run_id, first.config.model_dump(mode="json")) as run,
        run.stage(0, "warm_start") as attempt,
    ):
        attempt.write("metrics", [{"stage": "warm_start", "name": "x", "value": 1.0}])
    check_arm_runs(store, plan.arm_runs())  # unchanged: fine
    # a key the committed warm_start read (it evaluates policy_0)
    changed = suite.model_copy(update={"overrides": [*suite.overrides, "evaluation.n_prompts=4"]})
    plan = make_plan(name, changed, seeds=1, ablation_id=None, store_root=tmp_path)
    with pytest.raises(
        ConfigMismatchError,
        match=r"arm 'grpo_os', seed 0: run ablate-micro-grpo_os-s0 was started with another "
        r"config \(differing keys: evaluation.n_prompts\), so the suite changed since; pass a "
        r"new "
        r"--ablation-id",
    ):
        check_arm_runs(store, plan.arm_runs())


def test_seeds_may_change_until_the_ablation_table_is_committed_and_then_only_grow(
    tmp_path: Path,
) -> None:
    name, suite = load_suite("micro")
    plan = make_plan(name, suite, seeds=2, ablation_id=None, store_root=tmp_path)
    store = RunStore(tmp_path)
    with store.open_run(plan.ablation_id, plan.record()) as run:
        with run.stage(0, "warm_start") as attempt:  # the shared policy_0 is committed
            attempt.write("metrics", [{"stage": "warm_start", "name": "x", "value": 1.0}])
        more_seeds = make_plan(name, suite, seeds=3, ablation_id=None, store_root=tmp_path)
        check_record(store, more_seeds)  # each arm-seed run stands alone: fine
        other = suite.model_copy(update={"overrides": ["grpo.steps=5"]})
        with pytest.raises(StoreError, match="was started with another suite"):
            check_record(
                store, make_plan(name, other, seeds=2, ablation_id=None, store_root=tmp_path)
            )
        with run.stage(0, "ablation") as attempt:
            attempt.write("ablation", [ablation_row(seed) for seed in (0, 1)])
    check_record(store, plan)
    check_record(store, more_seeds)  # the new seed runs and the table is rewritten
    # the suite file's description and default seed count compute nothing: edits are fine
    edited = suite.model_copy(update={"description": "reworded", "seeds": 7})
    check_record(store, make_plan(name, edited, seeds=2, ablation_id=None, store_root=tmp_path))
    one_seed = make_plan(name, suite, seeds=1, ablation_id=None, store_root=tmp_path)
    with pytest.raises(StoreError, match=r"finished with 2 seeds, more than the 1 asked for"):
        check_record(store, one_seed)


def ablation_row(seed: int) -> dict[str, object]:
    return {
        "ablation_id": "ablate-micro",
        "arm": "grpo_os",
        "seed": seed,
        "arm_run_id": f"ablate-micro-grpo_os-s{seed}",
        "policy_iteration": 0,
        "metric": "greedy_accuracy",
        "value": 0.5,
    }


def test_the_fig6_suite_is_the_default_suites_fig6_arms_at_more_seeds(tmp_path: Path) -> None:
    _, default = load_suite("default")
    name, fig6 = load_suite("fig6")
    assert set(fig6.arms) == {"grpo_os", "grpo_os_rm_once"}
    assert all(fig6.arms[arm] == default.arms[arm] for arm in fig6.arms)  # no drift
    assert (fig6.config, fig6.overrides) == (default.config, default.overrides)
    assert fig6.seeds > default.seeds
    plan = make_plan(name, fig6, seeds=None, ablation_id=None, store_root=tmp_path)
    assert plan.ablation_id == "ablate-fig6" and len(plan.arm_runs()) == 2 * fig6.seeds


def test_the_pairwise_orm_suite_differs_from_grpo_os_in_the_orm_objective_only(
    tmp_path: Path,
) -> None:
    _, default = load_suite("default")
    name, suite = load_suite("pairwise-orm")
    assert suite.arms["grpo_os"] == default.arms["grpo_os"]  # no drift from the default's
    pairwise = suite.arms["grpo_os_pairwise"]
    assert pairwise == [*default.arms["grpo_os"], "reward_models.orm.objective=pairwise"]
    assert (suite.config, suite.overrides, suite.seeds) == ("demo-ablate", [], 3)
    runs = make_plan(name, suite, seeds=None, ablation_id=None, store_root=tmp_path).arm_runs()
    objectives = {r.arm: r.config.reward_models.orm.objective for r in runs}
    assert objectives == {"grpo_os": "pointwise", "grpo_os_pairwise": "pairwise"}


def test_time_left_counts_each_remaining_run_at_its_arms_mean(tmp_path: Path) -> None:
    name, suite = load_suite("micro")
    runs = make_plan(name, suite, seeds=3, ablation_id=None, store_root=tmp_path).arm_runs()
    assert [r.arm for r in runs] == ["grpo_os"] * 3 + ["online_rft"] * 3
    assert time_left(runs, {}) == 0.0  # nothing measured yet
    took = {"grpo_os": [90.0, 100.0]}
    # grpo_os s2 at its arm's 95 s; online_rft, not run yet, at the mean of all runs (95 s)
    assert time_left(runs[2:], took) == 4 * 95.0
    took["online_rft"] = [30.0]  # a forked arm is faster: its own mean, not the overall one
    assert time_left(runs[4:], took) == 2 * 30.0
