"""`itergrpo run --config micro` end to end on local data: a MATH-format jsonl, a GSM8K-format
jsonl and a `datasets` save_to_disk DatasetDict (its own train/test splits). Each run completes
and its rollouts are judged in the data's answer format: the stored verdicts are the format's
verdicts on the stored completions, and some outputs are right in that format only."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict

from flows.cli import main
from flows.config_files import stored_config_migrated, validate_config
from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.data.tasks.registry import make_task
from storage.sql import run_query
from storage.store import RunStore

pytestmark = pytest.mark.slow

# Sums the micro policy learns to state in 200 warm-start steps, within its 24 new tokens; every
# character is in the tiny policy's alphabet (printable ASCII: \, {, } included).
SUMS = [(a, b) for a in range(1, 7) for b in range(1, 7)]
TEST_SUMS = [(a, b) for a in range(7, 9) for b in range(1, 3)]  # the DatasetDict's own test split


def math_row(a: int, b: int) -> dict[str, str]:
    return {
        "problem": f"What is {a}+{b}?",
        "solution": f"{a}+{b}={a + b}\n\\boxed{{{a + b}}}",
        "answer": str(a + b),
        "level": "Level 1",
        "type": "Prealgebra",
    }


def write_math_jsonl(folder: Path) -> Path:
    path = folder / "math.jsonl"
    rows = [{k: v for k, v in math_row(a, b).items() if k != "answer"} for a, b in SUMS]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def write_gsm8k_jsonl(folder: Path) -> Path:
    path = folder / "gsm8k.jsonl"
    rows = [
        {"question": f"What is {a}+{b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"}
        for a, b in SUMS
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def write_saved_dataset(folder: Path) -> Path:
    splits = {"train": SUMS, "test": TEST_SUMS}
    saved = DatasetDict(
        {
            name: Dataset.from_list([math_row(a, b) for a, b in sums])
            for name, sums in splits.items()
        }
    )
    saved.save_to_disk(folder / "sums")
    return folder / "sums"


LAYOUTS: dict[str, tuple[Callable[[Path], Path], str, str]] = {
    # how to write the data, its answer format, the other format (which must disagree)
    "math jsonl": (write_math_jsonl, "boxed", "gsm8k"),
    "gsm8k jsonl": (write_gsm8k_jsonl, "gsm8k", "boxed"),
    "save_to_disk DatasetDict": (write_saved_dataset, "boxed", "gsm8k"),
}


@pytest.mark.parametrize(("write", "fmt", "other"), LAYOUTS.values(), ids=LAYOUTS.keys())
def test_micro_runs_on_local_data_and_judges_in_its_answer_format(
    tmp_path: Path, write: Callable[[Path], Path], fmt: str, other: str
) -> None:
    data = write(tmp_path)
    store_dir = tmp_path / "store"
    # The CLI in this process (no kill here): a child process would add ~5 s of CPU imports.
    code = main(
        [
            *("run", "--config", "micro", "--run-id", "local", "--no-prefect"),
            *("--set", "task.name=local_files", "--set", f"task.local_files.path={data}"),
            *("--store", str(store_dir)),
        ]
    )
    assert code == 0
    store = RunStore(store_dir)
    assert store.run_status("local")["status"] == "completed"

    cfg = validate_config(stored_config_migrated(store.run_config("local")))
    task = make_task(cfg.task)
    assert task.answer_format.name == fmt
    judge, wrong_judge = ANSWER_FORMATS[fmt], ANSWER_FORMATS[other]
    rows = run_query(
        store,
        "SELECT p.question, p.answer, r.completion, r.correct, r.extracted_answer FROM rollouts r "
        "JOIN prompts p USING (run_id, iteration, problem_id) WHERE r.run_id = 'local'",
    ).to_pylist()
    assert len(rows) == cfg.run.iterations * cfg.rollout.prompts * cfg.rollout.group_size
    gold = {f"What is {a}+{b}?": str(a + b) for a, b in SUMS}
    assert all(gold.get(r["question"]) == r["answer"] for r in rows)  # train questions only
    assert [r["correct"] for r in rows] == [
        judge.is_correct(r["answer"], r["completion"]) for r in rows
    ]
    assert [r["extracted_answer"] for r in rows] == [judge.extract(r["completion"]) for r in rows]
    right_here_only = [
        r for r in rows if r["correct"] and not wrong_judge.is_correct(r["answer"], r["completion"])
    ]
    assert right_here_only, "no output was right in the data's format and wrong in the other"

    evaluated = run_query(
        store,
        "SELECT n FROM eval WHERE run_id = 'local' AND metric = 'greedy_accuracy' "
        "AND split = 'test' AND policy_iteration = 0",
    ).to_pylist()
    test_problems = task.problems("test", 10_000, seed=0)
    assert evaluated == [{"n": min(cfg.evaluation.n_prompts, len(test_problems))}]
    if "sums" in str(data):  # the DatasetDict's own test split, not a hash split of train
        assert {p.question for p in test_problems} == {f"What is {a}+{b}?" for a, b in TEST_SUMS}
