import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from grpo_core.data.tasks import TaskConfig, make_task
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Problem, TaskDataError
from grpo_core.data.tasks.reasoning_gym import gold_solution


def test_arith_is_deterministic_per_seed_and_splits_do_not_overlap() -> None:
    task = ArithTask()
    assert task.problems("train", 50, seed=3) == task.problems("train", 50, seed=3)
    assert task.problems("train", 50, seed=3) != task.problems("train", 50, seed=4)
    train = {p.question for p in task.problems("train", 2000, seed=0)}
    test = {p.question for p in task.problems("test", 500, seed=1)}
    assert not train & test


def test_arith_family_and_split_sizes_by_hand() -> None:
    # chains of 1-2 additions of 1..2: 2^2 + 2^3 = 12 questions, split between train and test
    task = ArithTask(min_steps=1, max_steps=2, operand_max=2, operators="+")
    assert task.family_size() == 12
    assert task.split_size("train") + task.split_size("test") == 12  # type: ignore[operator]
    # two operators double each step's choices: 3^2 * 2 + 3^3 * 4 = 126
    assert ArithTask(min_steps=1, max_steps=2, operand_max=3, operators="+-").family_size() == 126
    assert ArithTask().family_size() > 200_000 and ArithTask().split_size("test") is None


def test_distinct_test_draws_skip_repeats_and_refuse_more_than_the_split_has() -> None:
    repeated = ArithTask(min_steps=3, max_steps=5, operand_max=3, operators="+")
    distinct = ArithTask(min_steps=3, max_steps=5, operand_max=3, operators="+", distinct_test=True)
    with_repeats = [p.question for p in repeated.problems("test", 150, seed=4)]
    drawn = [p.question for p in distinct.problems("test", 150, seed=4)]
    assert len(set(with_repeats)) < 150 and len(set(drawn)) == 150
    # the same draws, the repeats skipped: the first repeat is where they part
    first_repeat = next(i for i, q in enumerate(with_repeats) if q in with_repeats[:i])
    assert drawn[:first_repeat] == with_repeats[:first_repeat]
    available = distinct.split_size("test")
    assert available is not None and len(distinct.problems("test", available, seed=0)) == available
    with pytest.raises(TaskDataError, match=r"203 different test questions .* 204 were asked"):
        distinct.problems("test", 204, seed=0)
    # training draws repeat: the warm start draws thousands of a few hundred questions
    assert len({p.question for p in distinct.problems("train", 2000, seed=0)}) < 2000
    made = make_task(TaskConfig(arith={"operand_max": 3, "distinct_test": True}))
    assert made.distinct_test  # type: ignore[attr-defined]


def test_arith_gold_solutions_are_correct_step_by_step() -> None:
    task = ArithTask(min_steps=1, max_steps=5, operand_max=99, operators="+-*")
    for p in task.problems("train", 200, seed=0):
        assert p.solution is not None
        assert task.is_correct(p, p.solution)
        assert all(task.step_labels(p, p.solution) or [False])
        assert str(eval(p.question)) == p.answer  # question precedence = chain order


def test_arith_question_parenthesises_products() -> None:
    p = Problem("x", "(3+4)*2", "14", "3+4=7\n7*2=14\n#### 14")
    assert ArithTask(operators="+*").step_labels(p, p.solution or "") == [True, True, True]


@pytest.mark.parametrize(
    ("completion", "labels", "correct"),
    [
        ("3+4=7\n7-2=5\n#### 5", [True, True, True], True),
        ("3+4=8\n8-2=6\n#### 6", [False, False, False], False),  # consistent, wrong w.r.t. q
        ("3+4=7\n7+2=9\n#### 9", [True, False, False], False),  # wrong operator
        ("3+4=7\n7-3=4\n#### 4", [True, False, False], False),  # wrong operand
        ("3 + 4 = 7\n\n7 - 2 = 5\n####  5", [True, True, True], True),  # spaces, blank line
        ("3+4=8\n7-2=5\n#### 5", [False, True, True], True),  # recovers from a slip
        ("#### 5", [True], True),
        ("3+4=7\n7-2=5\n5+0=5\n#### 5", [True, True, False, True], True),  # extra step
        ("3+4=7\n7-2=5", [True, True], False),  # no final answer
        ("7\n#### 5\n#### 6", [False, True, False], False),  # last #### counts
    ],
)
def test_arith_step_labels_and_verifier(completion: str, labels: list[bool], correct: bool) -> None:
    task = ArithTask()
    problem = Problem("p", "3+4-2", "5", "3+4=7\n7-2=5\n#### 5")
    assert task.step_labels(problem, completion) == labels
    assert task.is_correct(problem, completion) is correct


def test_arith_corrupt_injects_one_wrong_step() -> None:
    import random

    task = ArithTask()
    p = task.problems("train", 1, seed=0)[0]
    bad = task.corrupt(p, random.Random(0))
    labels = task.step_labels(p, bad)
    assert labels is not None and not all(labels)
    assert not task.is_correct(p, bad)


def test_task_config_validates_and_builds() -> None:
    assert make_task(TaskConfig(arith={"max_steps": 3})).name == "arith"
    with pytest.raises(ValidationError, match=r"task\.arith\.min_steps \(5\) must be <="):
        TaskConfig(arith={"min_steps": 5, "max_steps": 2})
    with pytest.raises(ValidationError, match=r"task\.arith\.operators must be"):
        TaskConfig(arith={"operators": "/"})
    with pytest.raises(ValidationError, match="task has no field 'unknown_knob'"):
        TaskConfig.model_validate({"unknown_knob": 1})
    with pytest.raises(ValidationError, match=r"task\.local_files\.path is required"):
        TaskConfig(name="local_files")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_local_files_reads_gsm8k_format(tmp_path: Path, fmt: str) -> None:
    rows = [
        {
            "question": f"Tom has {i} apples and buys 2. How many?",
            "answer": f"{i}+2=<<{i}+2={i + 2}>>{i + 2}\n#### {i + 2:,}",
        }
        for i in range(998, 1030)
    ]
    path = tmp_path / f"gsm.{fmt}"
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    cfg = TaskConfig(name="local_files", local_files={"path": str(path)}, test_fraction=0.5)
    task = make_task(cfg)
    train, test = task.problems("train", 100, 0), task.problems("test", 100, 0)
    assert len(train) + len(test) == len(rows)
    assert not {p.question for p in train} & {p.question for p in test}
    p = train[0]
    assert "<<" not in (p.solution or "")
    assert task.is_correct(p, f"#### {p.answer}") and "," not in p.answer
    assert task.step_labels(p, "x") is None


def test_reasoning_gym_adapter() -> None:
    pytest.importorskip("reasoning_gym", reason="reasoning-gym not installed (itergrpo[real])")
    task = make_task(
        TaskConfig(
            name="reasoning_gym",
            reasoning_gym={"dataset": "chain_sum", "options": {"max_terms": 3}},
        )
    )
    train, test = task.problems("train", 20, 0), task.problems("test", 20, 0)
    assert train == task.problems("train", 20, 0)
    assert not {p.question for p in train} & {p.question for p in test}
    p = train[0]
    assert task.is_correct(p, f"work\n#### {p.answer}")
    assert not task.is_correct(p, "no answer")
    assert all(q.solution is not None and task.is_correct(q, q.solution) for q in train)
    gsm_symbolic = TaskConfig(name="reasoning_gym", reasoning_gym={"dataset": "gsm_symbolic"})
    gsm = make_task(gsm_symbolic).problems("train", 2, 0)
    assert gsm[0].solution is not None and gsm[0].solution.rstrip().endswith(gsm[0].answer)


def test_reasoning_gym_gold_solution_forms() -> None:
    expr = {"answer": "-4", "metadata": {"expression": "0 - 4"}}
    assert gold_solution(expr) == "0 - 4 = -4\n#### -4"
    cot = {"answer": "7", "metadata": {"answer_cot": "3 + 4 = 7", "expression": "3 + 4"}}
    assert gold_solution(cot) == "3 + 4 = 7\n#### 7"
    done = {"answer": "7", "metadata": {"answer_cot": "3 + 4 = 7\n#### 7"}}
    assert gold_solution(done) == "3 + 4 = 7\n#### 7"
    assert gold_solution({"answer": "x", "metadata": {}}) is None
