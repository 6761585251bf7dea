"""Every row a run can draw checked at pre-flight (flows/preflight_rows.py): a prompt too long
for the policy or the reward models deep in a data file, where the first draws do not reach,
is refused in one line naming every limit, or dropped (task.local_files.on_bad_rows: drop) as
the run's task drops it, counted in status.json; and a warning when most gold solutions are
longer than the sampling stages' max_new_tokens."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import flows.preflight_data as preflight_data
from flows.config import ItergrpoConfig
from flows.config_files import load_config
from flows.context import RunContext
from flows.errors import PreflightError
from flows.guards import label_balance_finding
from flows.preflight_data import check_policy_and_data, task_of_run
from grpo_core.data.tasks.base import RowTask
from grpo_core.data.tasks.registry import make_task
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from storage.store import RunStore

ROWS = 200
LONG_QUESTION = "What is " + "1+" * 300 + "1?"  # 610 characters: over the tiny policy's 512


def _row(a: int) -> str:
    return json.dumps({"question": f"What is {a}+1?", "answer": f"{a}+1={a + 1}\n#### {a + 1}"})


def _config(tmp_path: Path, *sets: str) -> ItergrpoConfig:
    """The micro run (tiny policy: 512 positions; RMs: max_length 512) on a 200-row train
    file and a 20-row test file."""
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    if not train.exists():
        train.write_text("\n".join(_row(a) for a in range(ROWS)) + "\n")
        test.write_text("\n".join(_row(a) for a in range(1000, 1020)) + "\n")
    return load_config(
        "micro",
        [
            f"store.root={tmp_path / 'store'}",
            "run.run_id=rows",
            "task.name=local_files",
            f"task.local_files.path={train}",
            f"task.local_files.test_path={test}",
            *sets,
        ],
    )


def _long_row_deep_in_the_file(cfg: ItergrpoConfig) -> int:
    """Make the last row that the first draw of the largest stage does not reach a question
    too long for the policy; its 0-based index (rows keep their seeded order: the count is
    unchanged)."""
    task = make_task(cfg.task)
    wanted = max(cfg.rollout.prompts, cfg.grpo.steps * cfg.grpo.prompts_per_step)
    first = {p.problem_id for p in task.problems("train", wanted, cfg.run.seed)}
    deep = max(i for i in range(ROWS) if f"{task.name}-train-{i}" not in first)
    assert deep > wanted  # deep in the file, and not among the first drawn
    path = Path(str(cfg.task.local_files.path))  # type: ignore[attr-defined]
    lines = path.read_text().splitlines()
    lines[deep] = json.dumps({"question": LONG_QUESTION, "answer": "#### 301"})
    path.write_text("\n".join(lines) + "\n")
    return deep


def test_a_long_row_deep_in_the_file_is_refused_naming_every_limit(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    deep = _long_row_deep_in_the_file(cfg)
    with pytest.raises(PreflightError) as err:
        check_policy_and_data(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "task local_files/train.jsonl: 1 of 220 rows too long for the run: prompt + up to 24 "
        "new tokens (rollout.max_new_tokens, the largest max_new_tokens) exceeds the policy's "
        "context (max_position_embeddings) = 512 (with up to 48 tokens after the prompt: "
        "rollout.max_new_tokens + labelling.max_new_tokens, a labelled step prefix) in 1 row(s), "
        "exceeds reward_models.max_length = 512 in 1 row(s); the longest, "
        f"{tmp_path / 'train.jsonl'}:{deep + 1}, has a "
    )
    assert message.endswith(
        "shorten or remove these rows, set task.local_files.on_bad_rows: drop to leave them "
        "out, lower the max_new_tokens settings, use a policy with a longer context, or raise "
        "reward_models.max_length"
    )


def test_a_limit_the_rows_fit_is_named_beside_the_one_they_exceed(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "reward_models.max_length=2048")
    _long_row_deep_in_the_file(cfg)
    with pytest.raises(
        PreflightError,
        match=r"prefix\) in 1 row\(s\), fits reward_models\.max_length = 2048; the longest",
    ) as err:
        check_policy_and_data(cfg)
    assert "raise reward_models.max_length" not in str(err.value)


def test_the_policy_must_hold_a_labelled_prefix_and_its_completion(tmp_path: Path) -> None:
    """Math-Shepherd labelling writes up to labelling.max_new_tokens after a step prefix of an
    output (up to rollout.max_new_tokens): the policy's context must hold both after the
    prompt, the reward models' only the output; without PRM labelling, only the largest."""
    budgets = ("rollout.max_new_tokens=250", "labelling.max_new_tokens=250")
    with pytest.raises(PreflightError) as err:
        check_policy_and_data(_config(tmp_path, *budgets))
    assert (
        "exceeds the policy's context (max_position_embeddings) = 512 (with up to 500 tokens "
        "after the prompt: rollout.max_new_tokens + labelling.max_new_tokens, a labelled step "
        "prefix) in 220 row(s), fits reward_models.max_length = 512;"
    ) in str(err.value)
    check_policy_and_data(_config(tmp_path, *budgets, "reward_models.use_prm=false"))


def test_a_vllm_max_model_len_is_a_limit_of_its_own(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "engines.rollout=vllm", "engines.vllm.max_model_len=64")
    with pytest.raises(PreflightError) as err:
        check_policy_and_data(cfg)
    assert "exceeds engines.vllm.max_model_len = 64 (with up to 48 tokens" in str(err.value)
    assert str(err.value).endswith("or raise engines.vllm.max_model_len")


def test_drop_leaves_the_long_row_out_of_every_draw_and_the_run_records_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path, "task.local_files.on_bad_rows=drop")
    before = make_task(cfg.task)
    deep = _long_row_deep_in_the_file(cfg)
    long_id = f"{before.name}-train-{deep}"
    with caplog.at_level(logging.WARNING, logger="itergrpo"):
        check_policy_and_data(cfg)
    assert (
        "task local_files/train.jsonl: dropped 1 of 220 rows too long for the run "
        "(task.local_files.on_bad_rows: drop): prompt + up to 24 new tokens" in caplog.text
    )

    task, dropped = task_of_run(cfg)
    assert dropped == 1 and isinstance(task, RowTask)
    assert long_id not in {p.problem_id for p in task.every_problem("train")}
    assert len(task.every_problem("train")) == ROWS - 1
    for seed in range(5):  # the others keep their seeded order and ids
        drawn = [p.problem_id for p in task.problems("train", ROWS, seed)]
        assert drawn == [
            p.problem_id for p in before.problems("train", ROWS, seed) if p.problem_id != long_id
        ]

    store = RunStore(cfg.store.resolved_root())
    with store.open_run("rows", cfg.model_dump(mode="json")) as run:
        ctx = RunContext(cfg, store, run)
        try:
            assert long_id not in {p.problem_id for p in ctx.task.problems("train", ROWS, 3)}
        finally:
            ctx.close()
    status = json.loads((store.run_dir("rows") / "status.json").read_text())
    assert status["rows_dropped"] == 1


def test_the_earlier_names_of_on_bad_rows_still_load(tmp_path: Path) -> None:
    skip = _config(tmp_path, "task.local_files.on_bad_rows=skip")
    error = _config(tmp_path, "task.on_bad_rows=error")  # the flat key of earlier versions
    assert skip.task.local_files.on_bad_rows == "drop"  # type: ignore[attr-defined]
    assert error.task.local_files.on_bad_rows == "refuse"  # type: ignore[attr-defined]
    assert _config(tmp_path).task.local_files.on_bad_rows == "refuse"  # type: ignore[attr-defined]


def _math_rows(path: Path, steps: int) -> Path:
    """MATH-format rows whose solutions are `steps` lines of 10 characters, then the answer."""
    rows = [
        {"problem": f"What is {a}+1?", "solution": "1+1=2 ok.\n" * steps + f"\\boxed{{{a + 1}}}"}
        for a in range(40)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.parametrize("steps", [1, 6])
def test_a_warning_when_most_gold_solutions_are_longer_than_max_new_tokens(
    tmp_path: Path, steps: int, caplog: pytest.LogCaptureFixture
) -> None:
    data = _math_rows(tmp_path / "math.jsonl", steps)  # 6 steps: 70 characters, over 24 and 48
    cfg = load_config(
        "micro",
        [
            f"store.root={tmp_path / 'store'}",
            "run.run_id=math",
            "task.name=local_files",
            f"task.local_files.path={data}",
            "task.test_fraction=0.5",
            "evaluation.max_new_tokens=48",
            "evaluation.n_prompts=4",
            "reward_models.eval_prompts=4",
        ],
    )
    with caplog.at_level(logging.WARNING, logger="itergrpo"):
        check_policy_and_data(cfg)
    warned = [r.getMessage() for r in caplog.records if "gold solutions" in r.getMessage()]
    if steps == 1:  # 25 characters: within every max_new_tokens
        assert warned == []
        return
    (message,) = warned
    assert "most gold solutions are longer than the run lets the policy write (median " in message
    assert "rollout.max_new_tokens = 24 (100%), grpo.max_new_tokens = 24 (100%), " in message
    assert "evaluation.max_new_tokens = 48 (100%)" in message
    assert "(the one-class guard stops the run); raise those max_new_tokens" in message


def test_the_one_class_guards_fix_names_both_reward_models() -> None:
    finding = label_balance_finding("prm", correct=0, total=12, iteration=1, min_minority=2)
    assert finding is not None
    assert "reward_models.use_orm: false and reward_models.use_prm: false" in finding


def test_a_smollm2_policy_not_yet_converted_has_its_rows_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its tokenizer comes with the conversion, the first stage's work: the pre-flight does it
    (here a saved tiny policy stands in for the converted model)."""
    converted = tmp_path / "converted"
    tokenizer = build_char_tokenizer()
    config = PolicyConfig(n_layers=1, hidden_size=32, n_heads=2, max_position_embeddings=64)
    create_tiny_policy(config, tokenizer).save_pretrained(converted)
    tokenizer.save_pretrained(converted)
    asked: list[str | None] = []

    def convert(cache_dir: str | None) -> Path:
        asked.append(cache_dir)
        return converted

    monkeypatch.setattr(preflight_data, "find_gguf", lambda: tmp_path / "smollm2.gguf")
    monkeypatch.setattr(preflight_data, "find_spec", lambda name: object())
    monkeypatch.setattr(preflight_data, "smollm2_path", convert)
    cache = str(tmp_path / "not-converted")
    cfg = _config(tmp_path, "policy.kind=smollm2", f"policy.cache_dir={cache}")
    _long_row_deep_in_the_file(cfg)
    with pytest.raises(PreflightError, match=r"\(max_position_embeddings\) = 64 \(with"):
        check_policy_and_data(cfg)
    assert asked == [cache]
