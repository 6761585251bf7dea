"""End to end on the `micro` preset: every stage committed once, SQL invariants, resume skips."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from flows.loop import execute_run
from flows.names import ITERATION_STAGES, WARM_START
from storage.replay import replay_count
from storage.sql import run_query
from storage.store import RunStore
from tests.flow_helpers import micro_config, snapshot

pytestmark = pytest.mark.slow


def sql(store: RunStore, query: str) -> list[dict]:
    return run_query(store, query).to_pylist()


def test_every_stage_of_every_iteration_is_committed_exactly_once(
    micro_run: tuple[RunStore, str],
) -> None:
    store, run_id = micro_run
    cfg = micro_config(store.root, run_id)
    rows = sql(
        store,
        "SELECT stage, iteration, count(*) AS n FROM stages "
        f"WHERE run_id = '{run_id}' AND status = 'committed' GROUP BY ALL",
    )
    committed = {(r["stage"], r["iteration"]): r["n"] for r in rows}
    expected = {(WARM_START, 0)} | {
        (s, k) for k in range(cfg.run.iterations) for s in ITERATION_STAGES
    }
    assert set(committed) == expected
    assert set(committed.values()) == {1}
    assert store.run_status(run_id)["status"] == "completed"


def test_each_prompt_has_g_rollouts_and_labels_match_rollouts(
    micro_run: tuple[RunStore, str],
) -> None:
    store, run_id = micro_run
    cfg = micro_config(store.root, run_id)
    groups = sql(
        store,
        "SELECT iteration, problem_id, count(*) AS n, count(DISTINCT sample_index) AS d "
        f"FROM rollouts WHERE run_id = '{run_id}' GROUP BY ALL",
    )
    assert len(groups) == cfg.run.iterations * cfg.rollout.prompts
    assert {(g["n"], g["d"]) for g in groups} == {(cfg.rollout.group_size,) * 2}
    unmatched = sql(
        store,
        "SELECT count(*) AS n FROM rollouts r FULL JOIN orm_labels l USING "
        "(run_id, iteration, problem_id, sample_index) "
        f"WHERE coalesce(r.run_id, l.run_id) = '{run_id}' "
        "AND (r.problem_id IS NULL OR l.problem_id IS NULL "
        "OR l.label <> CAST(r.correct AS TINYINT))",
    )
    assert unmatched == [{"n": 0}]
    # One PRM row per non-empty line of each rollout, the last one labelled by the verifier.
    steps = sql(
        store,
        "SELECT r.iteration, r.problem_id, r.sample_index, r.completion, r.correct, "
        "count(p.step_index) AS n, max(p.step_index) AS last, "
        "arg_max(p.hard_label, p.step_index) AS last_label "
        "FROM rollouts r LEFT JOIN prm_labels p USING (run_id, iteration, problem_id, "
        f"sample_index) WHERE r.run_id = '{run_id}' GROUP BY ALL",
    )
    for s in steps:
        lines = [line for line in s["completion"].split("\n") if line.strip()]
        assert s["n"] == len(lines)
        if lines:
            assert s["last"] == len(lines) - 1 and s["last_label"] == int(s["correct"])


def test_rm_train_mixes_10_percent_replay_from_earlier_iterations_only(
    micro_run: tuple[RunStore, str],
) -> None:
    store, run_id = micro_run
    cfg = micro_config(store.root, run_id)
    mix = sql(
        store,
        "SELECT iteration, rm_kind, source, count(*) AS n, max(origin_iteration) AS newest, "
        f"min(origin_iteration) AS oldest FROM rm_train WHERE run_id = '{run_id}' "
        "AND epoch = 0 GROUP BY ALL ORDER BY ALL",
    )
    by_key = {(m["iteration"], m["rm_kind"], m["source"]): m for m in mix}
    for (k, _kind, source), m in by_key.items():
        if source == "new":
            assert m["oldest"] == m["newest"] == k
        else:
            assert k > 0 and m["newest"] < k
    for kind, table in (("orm", "orm_labels"), ("prm", "prm_labels")):
        assert (0, kind, "replay") not in by_key
        new_rows = by_key[(1, kind, "new")]["n"]
        labels_0 = sql(store, f"SELECT count(*) AS n FROM {table} WHERE iteration = 0")[0]["n"]
        want = replay_count(new_rows, cfg.reward_models.replay_ratio, labels_0)
        assert by_key[(1, kind, "replay")]["n"] == want > 0
        share = want / (want + new_rows)
        assert abs(share - cfg.reward_models.replay_ratio) <= 0.5 / (want + new_rows) + 1e-9


def test_grpo_samples_and_metrics_cover_every_step(micro_run: tuple[RunStore, str]) -> None:
    store, run_id = micro_run
    cfg = micro_config(store.root, run_id)
    per_step = sql(
        store,
        "SELECT iteration, step, count(*) AS n, count(DISTINCT (problem_id, sample_index)) AS d "
        f"FROM policy_samples WHERE run_id = '{run_id}' GROUP BY ALL",
    )
    assert len(per_step) == cfg.run.iterations * cfg.grpo.steps
    size = cfg.grpo.prompts_per_step * cfg.grpo.group_size
    assert {(r["n"], r["d"]) for r in per_step} == {(size, size)}
    # Outcome advantages are group z-scores: they sum to ~0 within each prompt's group.
    sums = sql(
        store,
        "SELECT max(abs(s)) AS worst FROM (SELECT sum(advantage) AS s FROM policy_samples "
        f"WHERE run_id = '{run_id}' GROUP BY iteration, step, problem_id)",
    )
    assert sums[0]["worst"] < 1e-4
    kl = sql(
        store,
        "SELECT count(*) AS n FROM metrics WHERE stage = 'grpo' AND name = 'kl' "
        f"AND run_id = '{run_id}' AND value >= 0",
    )
    assert kl == [{"n": cfg.run.iterations * cfg.grpo.steps}]


def test_eval_rows_cover_each_policy_and_rm_drift_of_each_iteration(
    micro_run: tuple[RunStore, str],
) -> None:
    store, run_id = micro_run
    rows = sql(
        store,
        f"SELECT policy_iteration, list(DISTINCT metric) AS m FROM eval WHERE run_id = '{run_id}' "
        "GROUP BY ALL ORDER BY ALL",
    )
    assert [r["policy_iteration"] for r in rows] == [0, 1, 2]
    fresh = {"orm_auroc", "best_of_n_accuracy", "prm_step_auroc", "prm_step_majority_baseline"}
    stale = {"orm_auroc_stale", "prm_step_auroc_stale"}
    for r in rows:
        assert {"greedy_accuracy", "pass@k", "maj@k", "sampled_accuracy"} <= set(r["m"])
        k = r["policy_iteration"]
        # RM_k is measured on policy_k (k < iterations), RM_{k-1} beside it from k = 1 on.
        assert (fresh <= set(r["m"])) == (k < 2)
        assert (stale <= set(r["m"])) == (k == 1)
    # micro's RMs see both labels, so every AUROC is defined (NaN would mean one class).
    # Drift is measured on both splits: GRPO's (train) questions and unseen (test) ones.
    aurocs = sql(
        store,
        f"SELECT split, metric, value FROM eval WHERE run_id = '{run_id}' "
        "AND metric LIKE '%auroc%'",
    )
    assert len(aurocs) == 12
    assert {a["split"] for a in aurocs} == {"train", "test"}
    assert all(0.0 <= a["value"] <= 1.0 for a in aurocs), aurocs
    # Each evaluated problem names its question (the clusters of comparisons between policies):
    # one question per problem_index, the same at every policy.
    (named,) = sql(
        store,
        "SELECT count(*) FILTER (WHERE question IS NULL OR question = '') AS unnamed, "
        "count(DISTINCT (problem_index, question)) AS pairs, "
        f"count(DISTINCT problem_index) AS problems FROM eval_problems WHERE run_id = '{run_id}'",
    )
    assert named["unnamed"] == 0 and named["pairs"] == named["problems"] > 0


def test_each_guard_metric_agrees_with_the_numbers_it_judged(
    micro_run: tuple[RunStore, str],
) -> None:
    """Every iteration stores each guard's verdict beside the figures it judged: the AUROC
    guard trips exactly where the retrained RM's AUROC on GRPO's questions is under the floor
    (micro's tiny RMs are near chance: at least one trips, the warn default lets the run go
    on), the labels guard passes (micro's RMs see both labels)."""
    store, run_id = micro_run
    floor = micro_config(store.root, run_id).guards.rm_auroc_floor
    verdicts = {
        (r["iteration"], r["name"]): r["value"]
        for r in sql(
            store,
            f"SELECT iteration, name, value FROM metrics WHERE run_id = '{run_id}' "
            "AND name LIKE 'guard_%'",
        )
    }
    aurocs = sql(
        store,
        f"SELECT policy_iteration AS k, metric, value FROM eval WHERE run_id = '{run_id}' "
        "AND split = 'train' AND metric IN ('orm_auroc', 'prm_step_auroc')",
    )
    assert len(aurocs) == 4  # ORM and PRM, iterations 0 and 1
    for a in aurocs:
        tripped = verdicts[a["k"], f"guard_rm_auroc_{a['metric'].split('_')[0]}"]
        assert tripped == float(a["value"] < floor), a
    assert any(verdicts[k] == 1.0 for k in verdicts if "rm_auroc" in k[1])
    for k in (0, 1):
        assert verdicts[k, "guard_rm_labels_orm"] == verdicts[k, "guard_rm_labels_prm"] == 0.0
        assert (k, "guard_equal_rewards") in verdicts
    # micro's 3 GRPO steps are fewer than the over-optimisation window (5): no verdict (it
    # stored 0, "passed", before), and the commit says why
    commits = {(c["iteration"], c["stage"]): c["info"] for c in store.committed_stages(run_id)}
    for k in (0, 1):
        assert (k, "guard_over_optimisation") not in verdicts
        why = commits[k, "grpo"]["guards_not_judged"]["guard_over_optimisation"]
        assert "had 3 step(s) with a learned reward, fewer than" in why


def test_orm_trains_on_both_labels(micro_run: tuple[RunStore, str]) -> None:
    store, run_id = micro_run
    labels = sql(
        store,
        f"SELECT iteration, list(DISTINCT label ORDER BY label) AS y FROM rm_train "
        f"WHERE run_id = '{run_id}' AND rm_kind = 'orm' GROUP BY ALL ORDER BY ALL",
    )
    assert [r["y"] for r in labels] == [[0.0, 1.0], [0.0, 1.0]]
    # Every trained row names the table its label came from.
    tables = sql(
        store,
        f"SELECT rm_kind, list(DISTINCT source_table) AS t FROM rm_train "
        f"WHERE run_id = '{run_id}' GROUP BY ALL ORDER BY ALL",
    )
    assert [(r["rm_kind"], r["t"]) for r in tables] == [
        ("orm", ["orm_labels"]),
        ("prm", ["prm_labels"]),
    ]
    # epochs at iteration 0, continual_epochs when continuing from the previous RM.
    epochs = sql(
        store,
        f"SELECT iteration, list(DISTINCT epoch ORDER BY epoch) AS e FROM rm_train "
        f"WHERE run_id = '{run_id}' GROUP BY ALL ORDER BY ALL",
    )
    assert [r["e"] for r in epochs] == [[0, 1], [0]]


def test_rerun_skips_everything_and_writes_nothing(micro_run: tuple[RunStore, str]) -> None:
    store, run_id = micro_run
    before = snapshot(store, run_id)
    results = execute_run(micro_config(store.root, run_id))
    assert all(r.skipped for r in results)
    assert snapshot(store, run_id) == before


def test_same_seed_reproduces_the_run(micro_run: tuple[RunStore, str], tmp_path: Path) -> None:
    store, run_id = micro_run
    execute_run(micro_config(tmp_path, "again", "run.iterations=1"))
    again = snapshot(RunStore(tmp_path), "again")
    first = snapshot(store, run_id)
    for table in ("prompts", "rollouts", "orm_labels", "prm_labels", "policy_samples"):
        want = [r for r in first[table] if r["iteration"] == 0]
        if table == "rollouts":  # the checkpoint path names the run
            for rows, run in ((again[table], "again"), (want, run_id)):
                assert {r.pop("policy_checkpoint") for r in rows} == {
                    f"checkpoints/{run}/policy/iter-0"
                }
        assert again[table] == want, table


def _status(root: Path, run_id: str) -> str:
    return (root / "runs" / run_id / "status.json").read_text()


@pytest.mark.parametrize("reach", ["copy", "copy/", "symlink"])
def test_a_moved_store_resumes_where_the_user_names_it(
    micro_run: tuple[RunStore, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    reach: str,
) -> None:
    """The store is the one named ($ITERGRPO_STORE here), not the one in the stored config:
    a copy, the same path spelled with a slash, or a link to it resumes and writes there."""
    from flows.cli import main

    store, run_id = micro_run
    copy = tmp_path / "copy"
    shutil.copytree(store.root, copy)
    named = str(copy) + "/" if reach == "copy/" else str(copy)
    if reach == "symlink":
        (tmp_path / "link").symlink_to(copy, target_is_directory=True)
        named = str(tmp_path / "link")
    original = _status(store.root, run_id)
    moved_before = _status(copy, run_id)
    monkeypatch.setenv("ITERGRPO_STORE", named)
    assert main(["resume", run_id, "--no-prefect"]) == 0
    assert _status(store.root, run_id) == original  # the original store is untouched
    assert _status(copy, run_id) != moved_before  # the named one was resumed
    recorded = yaml.safe_load((copy / "runs" / run_id / "config.yaml").read_text())
    assert recorded["store"]["root"] == str(Path(named).absolute())
    assert snapshot(RunStore(copy), run_id) == snapshot(store, run_id)
    # The printed query names the store: pasted in a shell without the variable, it works.
    (hint,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("query:")]
    monkeypatch.delenv("ITERGRPO_STORE")
    assert main(shlex.split(hint.removeprefix("query:"))[1:]) == 0
    assert "orm_auroc" in capsys.readouterr().out


def test_report_draws_every_panel_and_one_page_embeds_them(
    micro_run: tuple[RunStore, str], tmp_path: Path
) -> None:
    import matplotlib.image as mpimg

    from flows.report import PANELS, write_report

    store, run_id = micro_run
    written = write_report(store, run_id, tmp_path)
    names = [p.name for p in written]
    assert names == [*(f"{p.stem}.png" for p in PANELS), "rm_vs_verifier.png", "summary.md"]
    for path in written[:-1]:
        assert mpimg.imread(path).shape[2] in (3, 4)  # a real PNG
    page = (tmp_path / "summary.md").read_text()
    assert all(f"]({name})" in page for name in names[:-1])
    assert f"--store {store.root}" in page  # the SQL hint pastes into any shell
