"""ORM and Math-Shepherd PRM labels on hand-made arithmetic solutions with a scripted engine."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Problem
from grpo_core.model.policy import build_char_tokenizer
from reward_models.config import LabellingConfig
from reward_models.labelling import (
    LabelledSample,
    OrmLabel,
    PrmLabel,
    label_agreement,
    orm_labels,
    prm_labels_monte_carlo,
    step_prefixes,
)

TOKENIZER = build_char_tokenizer()
TASK = ArithTask()
PROBLEM = Problem("p0", "3+4-2", "5")
PROMPT = "Q: 3+4-2\nA:\n"
RIGHT = "3+4=7\n7-2=5\n#### 5"
WRONG = "3+4=8\n8-2=6\n#### 6"


class ScriptedEngine:
    """Answers each prompt with the completions `script(prompt)` returns; records the calls."""

    def __init__(self, script: Callable[[str], list[str]]) -> None:
        self.script = script
        self.calls: list[tuple[list[str], int, SamplingParams, int]] = []

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        self.calls.append((list(prompts), n, params, seed))
        texts = [t for p in prompts for t in self.script(p)[:n]]
        ids = [TOKENIZER(t, add_special_tokens=False)["input_ids"] for t in texts]
        return RolloutBatch(
            prompt_index=[i // n for i in range(len(texts))],
            prompt_ids=[[1] for _ in texts],
            completion_ids=ids,
            texts=texts,
            finish_reasons=["stop"] * len(texts),
            logprobs=[[0.0] * len(i) for i in ids],
        )


def sample(completion: str, index: int = 0, problem: Problem = PROBLEM) -> LabelledSample:
    ids = TOKENIZER(completion, add_special_tokens=False)["input_ids"]
    return LabelledSample(problem, PROMPT, completion, ids, index)


def continue_consistently(prompt: str) -> list[str]:
    """The continuation a careful solver writes after the prefix (right or wrong so far)."""
    prefix = prompt[len(PROMPT) :]
    if prefix in ("3+4=7\n", "3+4=8\n"):
        value = int(prefix[4])
        return [f"{value}-2={value - 2}\n#### {value - 2}"] * 4
    return [f"#### {prefix.splitlines()[-1].split('=')[1]}"] * 4


CFG = LabellingConfig(n_completions=4, max_new_tokens=16)


def test_step_prefixes_end_each_step_with_a_newline() -> None:
    assert step_prefixes(RIGHT) == ["3+4=7\n", "3+4=7\n7-2=5\n", RIGHT + "\n"]


def test_orm_labels_come_from_the_verifier_and_empty_is_zero() -> None:
    rows = orm_labels(TASK, [sample(RIGHT, 0), sample(WRONG, 1), sample("", 2)])
    assert rows == [OrmLabel("p0", 0, 1), OrmLabel("p0", 1, 0), OrmLabel("p0", 2, 0)]


def test_all_correct_prefixes_get_hard_1_and_soft_1() -> None:
    engine = ScriptedEngine(continue_consistently)
    rows = prm_labels_monte_carlo(engine, TOKENIZER, TASK, [sample(RIGHT)], CFG, seed=3)
    assert [(r.hard_label, r.soft_label) for r in rows] == [(1, 1.0), (1, 1.0), (1, 1.0)]
    assert [r.n_correct for r in rows] == [4, 4, 0]
    assert [r.exact_label for r in rows] == [1, 1, 1]
    assert [r.step_text for r in rows] == ["3+4=7", "7-2=5", "#### 5"]
    assert [r.step_end_token for r in rows] == [4, 10, 17]


def test_all_wrong_prefixes_get_hard_0_and_soft_0() -> None:
    engine = ScriptedEngine(continue_consistently)
    rows = prm_labels_monte_carlo(engine, TOKENIZER, TASK, [sample(WRONG)], CFG, seed=3)
    assert [(r.hard_label, r.soft_label) for r in rows] == [(0, 0.0), (0, 0.0), (0, 0.0)]
    assert [r.exact_label for r in rows] == [0, 0, 0]
    assert label_agreement(rows) == 1.0


def test_soft_label_is_the_fraction_of_completions_reaching_the_gold_answer() -> None:
    def mixed(prompt: str) -> list[str]:
        return ["7-2=5\n#### 5", "7-2=4\n#### 4", "7-2=5\n#### 5", "#### 9"]

    engine = ScriptedEngine(mixed)
    rows = prm_labels_monte_carlo(engine, TOKENIZER, TASK, [sample("3+4=7\n#### 5")], CFG, 0)
    first = rows[0]
    assert (first.n_completions, first.n_correct) == (4, 2)
    assert (first.hard_label, first.soft_label) == (1, 0.5)


def test_final_step_is_labelled_by_the_verifier_without_completions() -> None:
    engine = ScriptedEngine(lambda p: ["#### 5"] * 4)
    # steps 1-2 are right, the answer line is wrong: MC says 1, 1, the verifier says 0.
    rows = prm_labels_monte_carlo(engine, TOKENIZER, TASK, [sample("3+4=7\n7-2=5\n#### 4")], CFG, 0)
    final = rows[-1]
    assert (final.n_completions, final.n_correct, final.hard_label, final.soft_label) == (
        0,
        0,
        0,
        0.0,
    )
    assert [r.hard_label for r in rows] == [1, 1, 0]
    assert all(prompt.endswith("\n") for prompt in engine.calls[0][0])


def test_all_prefixes_of_all_samples_go_to_one_generate_call() -> None:
    engine = ScriptedEngine(continue_consistently)
    samples = [sample(RIGHT, 0), sample(WRONG, 1), sample("3+4=7\n#### 5", 2), sample("", 3)]
    unshared = CFG.model_copy(update={"shared_prefixes": False})
    rows = prm_labels_monte_carlo(engine, TOKENIZER, TASK, samples, unshared, seed=11)
    assert len(engine.calls) == 1
    prompts, n, params, seed = engine.calls[0]
    assert (n, seed, params.max_new_tokens, params.temperature) == (4, 11, 16, 1.0)
    assert prompts == [
        PROMPT + "3+4=7\n",
        PROMPT + "3+4=7\n7-2=5\n",
        PROMPT + "3+4=8\n",
        PROMPT + "3+4=8\n8-2=6\n",
        PROMPT + "3+4=7\n",
    ]
    assert [(r.sample_index, r.step_index) for r in rows] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
        (2, 1),
    ]


def test_a_prefix_shared_by_outputs_of_one_problem_is_estimated_once() -> None:
    calls: dict[str, int] = {}

    def counted(prompt: str) -> list[str]:  # the k-th time a prompt is sent: k right of 4
        calls[prompt] = calls.get(prompt, 0) + 1
        right = "7-2=5\n#### 5" if prompt.endswith("3+4=7\n") else "8-2=6\n#### 6"
        return [right] * calls[prompt] + ["#### 9"] * (4 - calls[prompt])

    other = Problem("p1", "3+4-2", "5")  # the same text under another id is not shared
    samples = [sample(RIGHT, 0), sample("3+4=7\n#### 5", 1), sample(RIGHT, 0, other)]
    for shared, first_counts in ((True, [1, 1, 2]), (False, [1, 2, 3])):
        engine = ScriptedEngine(counted)
        calls.clear()
        cfg = CFG.model_copy(update={"shared_prefixes": shared})
        rows = prm_labels_monte_carlo(engine, TOKENIZER, TASK, samples, cfg, seed=0)
        prompts = engine.calls[0][0]
        first_steps = [r for r in rows if r.step_index == 0]
        assert [r.n_correct for r in first_steps] == first_counts
        assert prompts.count(PROMPT + "3+4=7\n") == (2 if shared else 3)
        # every non-final step keeps its own row, its estimate from N completions
        assert [(r.problem_id, r.sample_index, r.step_index) for r in rows] == [
            ("p0", 0, 0), ("p0", 0, 1), ("p0", 0, 2), ("p0", 1, 0), ("p0", 1, 1),
            ("p1", 0, 0), ("p1", 0, 1), ("p1", 0, 2),
        ]  # fmt: skip
        assert all(r.n_completions == 4 for r in first_steps)


def test_empty_and_single_step_completions_need_no_engine_call() -> None:
    engine = ScriptedEngine(continue_consistently)
    rows = prm_labels_monte_carlo(
        engine, TOKENIZER, TASK, [sample("", 0), sample("  \n", 1), sample("#### 5", 2)], CFG, 0
    )
    assert engine.calls == []
    assert [(r.sample_index, r.step_index, r.hard_label) for r in rows] == [(2, 0, 1)]


def test_a_completion_without_separator_is_one_step() -> None:
    engine = ScriptedEngine(continue_consistently)
    rows = prm_labels_monte_carlo(engine, TOKENIZER, TASK, [sample("3+4=7 7-2=5")], CFG, 0)
    assert [(r.step_index, r.step_text, r.hard_label) for r in rows] == [(0, "3+4=7 7-2=5", 0)]


def test_label_agreement_counts_matching_hard_and_exact_labels() -> None:
    def row(step: int, hard: int, exact: int | None, n: int = 4) -> PrmLabel:
        return PrmLabel("p", 0, step, "x", step, n, hard * n, hard, float(hard), exact)

    rows = [row(0, 1, 1), row(1, 1, 0), row(2, 0, 0), row(3, 0, None), row(4, 1, 1, n=0)]
    assert label_agreement(rows) == pytest.approx(3 / 4)
    assert label_agreement(rows, mc_only=True) == pytest.approx(2 / 3)
    assert math.isnan(label_agreement([]))


@pytest.mark.parametrize(
    "field, value",
    [("soft_label", math.nan), ("hard_label", math.nan), ("exact_label", math.nan)],
)
def test_nan_labels_are_rejected(field: str, value: float) -> None:
    row = {
        "problem_id": "p",
        "sample_index": 0,
        "step_index": 0,
        "step_text": "1+1=2",
        "step_end_token": 4,
        "n_completions": 4,
        "n_correct": 4,
        "hard_label": 1,
        "soft_label": 1.0,
        "exact_label": 1,
    }
    with pytest.raises(ValueError, match=field):
        PrmLabel.from_row({**row, field: value})
    with pytest.raises(ValueError, match="must be 0 or 1"):
        OrmLabel("p", 0, math.nan)  # type: ignore[arg-type]


def test_store_rows_convert_back_ignoring_extra_columns() -> None:
    row = {"problem_id": "p", "sample_index": 2, "label": 1, "run_id": "r", "iteration": 3}
    assert OrmLabel.from_row(row) == OrmLabel("p", 2, 1)
