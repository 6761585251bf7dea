"""A stage is one module plus its registration: a test registers a toy stage (the share of an
iteration's rollouts cut at the token budget, docs/extending.md) and the config's run.stages
accepts it, the loop commits and resumes past it, and the rerun rule, forks and tracking read
its declarations. The plan from run.stages refuses a stage that would not find what it reads."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from flows.config_files import load_config, stored_config_as_current
from flows.config_readers import first_iteration_reading, stages_reading
from flows.context import RunContext
from flows.errors import ConfigError
from flows.fork import checkpoints_written, shareable_prefix
from flows.loop import Executor, call_directly, execute_run
from flows.names import GRPO, ITERATION_STAGES, LABEL, ORM, POLICY, ROLLOUT, WARM_START
from flows.plan import planned_stages
from flows.progress import ProgressFn
from flows.stage_registry import Needs, StageSpec, registered
from flows.stage_results import mean, metric_rows
from flows.stages import STAGES, StageFn, StageResult
from flows.tracking.points import MetricPoint, stage_points
from reward_models.grpo_reward import models_needed
from storage.errors import ConfigMismatchError
from storage.store import RunStore
from tests.flow_helpers import micro_config

TRUNCATION = "truncation"


def truncation_stage(ctx: RunContext, iteration: int, progress: ProgressFn) -> StageResult:
    """The share of policy_k's rollouts cut at the token budget, as a metrics row."""
    rows = ctx.store.read("rollouts", run_id=ctx.run_id, iterations=[iteration]).to_pylist()
    metrics = {"truncated_share": mean(r["finish_reason"] == "length" for r in rows)}
    with ctx.run.stage(iteration, TRUNCATION) as attempt:
        attempt.write("metrics", metric_rows(TRUNCATION, metrics))
    return StageResult(TRUNCATION, iteration, metrics=metrics)


TRUNCATION_SPEC = StageSpec(
    TRUNCATION,
    truncation_stage,
    "the share of policy_k's rollouts cut at the token budget",
    commits=frozenset({"metrics"}),
    reads=(),  # none of the sections stages declare: only the run's own keys (seed, task, ...)
    needs=lambda cfg: Needs(tables=frozenset({"rollouts"})),
)


@pytest.fixture
def truncation() -> Iterator[str]:
    with registered(TRUNCATION_SPEC):
        yield TRUNCATION


def test_registered_is_undone_after_the_block_and_replaces_a_stage_in_place() -> None:
    names = STAGES.names()
    with registered(TRUNCATION_SPEC):
        assert STAGES.names() == [*names, TRUNCATION]
        assert (
            TRUNCATION
            in load_config("micro").model_json_schema()["$defs"]["RunSection"]["properties"][
                "stages"
            ]["items"]["enum"]
        )
    assert STAGES.names() == names
    label = STAGES[LABEL]
    with registered(dataclasses.replace(label, summary="a timed label")):
        assert STAGES.names() == names and STAGES[LABEL].summary == "a timed label"
    assert STAGES.names() == names and STAGES[LABEL] is label


def test_the_default_plan_is_todays_and_every_built_in_stage_resolves() -> None:
    cfg = load_config("micro")
    assert cfg.run.stages == list(ITERATION_STAGES)
    assert planned_stages(cfg) == [(WARM_START, 0)] + [
        (name, k) for k in range(cfg.run.iterations) for name in ITERATION_STAGES
    ]
    for name, spec in STAGES.items():
        assert callable(spec.fn) and spec.name == name


@pytest.mark.parametrize(
    ("stages", "sets", "refusal"),
    [
        ("[rollout, truncatoin]", [], r"unknown stage 'truncatoin': choose from \['rollout'"),
        ("[warm_start, rollout]", [], "warm_start runs once, before the iterations"),
        ("[rollout, rollout]", [], "rollout is listed twice"),
        (
            "[rollout, grpo, evaluate]",
            [],
            r"grpo of iteration 0 reads orm_0 \(grpo.rewards.orm = 0.5\), which no stage before "
            "it writes: add train_rm to run.stages, before grpo",
        ),
        (
            "[rollout, train_rm, grpo, evaluate]",
            [],
            r"train_rm of iteration 0 reads the orm_labels rows of its iteration "
            r"\(reward_models.orm.train\), which no stage before it commits: add label",
        ),
        (
            "[evaluate, grpo]",
            ["grpo.rewards.orm=0"],
            "evaluate of iteration 0 reads policy_1, which no stage before it writes: list grpo "
            "before evaluate in run.stages",
        ),
        (
            "[grpo, evaluate]",
            ["grpo.rewards.orm=0", "grpo.algo.adv_estimator=grpo_process"],
            r"grpo of iteration 0 reads prm_0 \(grpo.algo.adv_estimator = grpo_process\)",
        ),
        ("[rollout, label, train_rm]", [], "rollout of iteration 1 reads policy_1, which no stage"),
        ("[truncation, rollout]", [], "truncation of iteration 0 reads the rollouts rows"),
    ],
)
def test_a_plan_whose_stage_misses_what_it_reads_is_refused_naming_the_fix(
    truncation: str, stages: str, sets: list[str], refusal: str
) -> None:
    with pytest.raises(ConfigError, match=refusal):
        load_config("micro", [f"run.stages={stages}", *sets])


@pytest.mark.parametrize(
    ("stages", "sets"),
    [
        ("[rollout, grpo, evaluate]", ["grpo.rewards.orm=0"]),  # verifier-only GRPO, no RMs
        ("[grpo]", ["grpo.rewards.orm=0"]),
        ("[rollout, label, train_rm]", ["run.iterations=1"]),  # RM_0 only
        # frozen RMs are their source: train_rm needs no labels
        (
            "[rollout, train_rm, grpo, evaluate]",
            [
                "reward_models.use_prm=false",
                "reward_models.orm.train=false",
                "reward_models.orm.source=/m",
                "reward_models.orm.format=classifier",
            ],
        ),
        ("[rollout, truncation, label, train_rm, grpo, evaluate]", []),
    ],
)
def test_a_plan_whose_stages_find_what_they_read_is_accepted(
    truncation: str, stages: str, sets: list[str]
) -> None:
    cfg = load_config("micro", [f"run.stages={stages}", *sets])
    assert cfg.run.stages == yaml.safe_load(stages)


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["grpo.rewards.orm=0"],
        ["grpo.rewards.prm=1", "grpo.rewards.orm=0"],
        ["grpo.algo.adv_estimator=grpo_process"],
        ["grpo.preset=ppo", "grpo.algo.ppo.critic_init=orm", "grpo.rewards.orm=0"],
    ],
)
def test_the_grpo_stage_needs_the_reward_models_it_loads(sets: list[str]) -> None:
    cfg = load_config("micro", sets)
    g = cfg.grpo
    loaded = models_needed(g.rewards, g.algo.process_supervision)
    if g.algo.estimator.needs_values and g.algo.ppo.critic_init == ORM:
        loaded.add(ORM)
    needs = STAGES[GRPO].needs(cfg).checkpoints
    assert needs == {(POLICY, 0), *((kind, 0) for kind in loaded)}


def test_a_toy_stages_declared_readers_are_the_rerun_rule_and_fork_rule(truncation: str) -> None:
    assert stages_reading("labelling.n_completions") == {LABEL}  # it declared it reads none
    assert stages_reading("run.stages") == {*ITERATION_STAGES, TRUNCATION}  # the plan before it
    assert stages_reading("rollout.prompts") == set(ITERATION_STAGES)  # not the toy's
    assert stages_reading("policy.kind") is None  # a key no stage declares: every stage
    assert first_iteration_reading("reward_models.retrain") == 1
    assert checkpoints_written([(TRUNCATION, 0), (GRPO, 0)]) == [
        ("policy", 1),
        ("policy-lora", 1),
        ("critic", 1),
    ]


def _failing_at(stage: str) -> Callable[[RunContext], Executor]:
    """Stages called directly, but `stage` raises (a stage that failed)."""

    def make(ctx: RunContext) -> Executor:
        direct = call_directly(ctx)

        def execute(name: str, iteration: int, fn: StageFn) -> StageResult:
            if name == stage:
                raise RuntimeError(f"{stage} failed")
            return direct(name, iteration, fn)

        return execute

    return make


@pytest.mark.slow
def test_a_registered_stage_runs_in_the_loop_commits_and_is_resumed_past(
    truncation: str, tmp_path: Path
) -> None:
    plan = f"run.stages=[{ROLLOUT}, {truncation}, {LABEL}]"
    cfg = micro_config(tmp_path, "toy", "run.iterations=1", plan)
    with pytest.raises(RuntimeError, match="label failed"):
        execute_run(cfg, make_executor=_failing_at(LABEL))
    store = RunStore(tmp_path)
    committed = [(str(r["stage"]), int(r["iteration"])) for r in store.committed_stages("toy")]
    assert committed == [(WARM_START, 0), (ROLLOUT, 0), (TRUNCATION, 0)]
    rollouts = store.read("rollouts", run_id="toy").to_pylist()
    share = mean(r["finish_reason"] == "length" for r in rollouts)
    expected = [MetricPoint(f"{TRUNCATION}/truncated_share", share, 0)]
    assert stage_points(store, "toy", TRUNCATION, 0, cfg.grpo.steps) == expected

    # A field only the failed stage reads may change (the toy declared it reads none of
    # labelling.*); with the toy's readers undeclared (every key) it may not.
    corrected = micro_config(tmp_path, "toy", "run.iterations=1", plan, "labelling.n_completions=3")
    source, target = cfg.model_dump(mode="json"), corrected.model_dump(mode="json")
    upgrade = functools.partial(stored_config_as_current, current=corrected)
    store.check_can_open("toy", target, upgrade_config=upgrade, stage_readers=stages_reading)
    done = planned_stages(cfg)
    assert shareable_prefix(done, done, source, target) == done[:3]  # another run may take it
    with registered(dataclasses.replace(TRUNCATION_SPEC, reads=None)):
        assert shareable_prefix(done, done, source, target) == done[:2]
        with pytest.raises(ConfigMismatchError, match=r"labelling\.n_completions"):
            store.check_can_open(
                "toy", target, upgrade_config=upgrade, stage_readers=stages_reading
            )

    # The rerun skips what is committed, the toy included, and runs label.
    results = execute_run(corrected)
    assert [(r.stage, r.skipped) for r in results] == [
        (WARM_START, True),
        (ROLLOUT, True),
        (TRUNCATION, True),
        (LABEL, False),
    ]
    assert store.read("metrics", run_id="toy", stage=TRUNCATION).num_rows == 1


def test_a_run_stored_before_run_stages_resumes_and_the_plan_is_read_by_the_iterations(
    tmp_path: Path,
) -> None:
    cfg = micro_config(tmp_path, "old")
    older = cfg.model_dump(mode="json")
    del older["run"]["stages"]
    store = RunStore(tmp_path)
    with store.open_run("old", older) as run, run.stage(0, ROLLOUT) as attempt:
        attempt.write("metrics", metric_rows(ROLLOUT, {"accuracy": 0.5}))
    upgrade = functools.partial(stored_config_as_current, current=cfg)
    store.check_can_open("old", cfg.model_dump(mode="json"), upgrade_config=upgrade)
    fewer = micro_config(tmp_path, "old", "run.stages=[rollout, label, train_rm, grpo]")
    with pytest.raises(ConfigMismatchError, match=r"run\.stages"):
        store.check_can_open(
            "old",
            fewer.model_dump(mode="json"),
            upgrade_config=functools.partial(stored_config_as_current, current=fewer),
            stage_readers=stages_reading,
        )


def test_preflight_reads_a_reward_models_source_only_when_the_plan_trains_it(
    tmp_path: Path,
) -> None:
    from flows.preflight_data import check_policy_and_data
    from grpo_core.contracts.errors import UserError

    missing = [
        f"reward_models.orm.source={tmp_path / 'no-rm'}",
        "reward_models.orm.format=classifier",
    ]
    with pytest.raises(UserError, match=r"reward_models\.orm"):
        check_policy_and_data(micro_config(tmp_path, "rm", *missing))
    verifier_only = ["run.stages=[rollout, grpo, evaluate]", "grpo.rewards.orm=0"]
    check_policy_and_data(micro_config(tmp_path, "rm", *missing, *verifier_only))
