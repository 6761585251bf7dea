"""Offline DPO's pairs file (grpo.pairs_file): every line checked with FILE:LINE in the
error, one problem per prompt, and the engine that answers a prompt with its stored pair."""

import json
from pathlib import Path

import pytest
import torch

from grpo_core.algo.advantages import AdvantageInputs
from grpo_core.algo.dpo import dpo_file_estimator
from grpo_core.contracts.rollout import SamplingParams
from grpo_core.data.pairs_file import pair_problems, read_pairs
from grpo_core.data.tasks.base import TaskDataError
from grpo_core.engines.pairs_rollout import PairsFileRollout
from grpo_core.model.policy import build_char_tokenizer

PARAMS = SamplingParams(max_new_tokens=8, temperature=1.0)


def write(path: Path, *lines: object) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_a_pairs_file_gives_one_problem_per_prompt(tmp_path: Path) -> None:
    path = write(
        tmp_path / "pairs.jsonl",
        {"prompt": "1+1", "chosen": "#### 2", "rejected": "#### 3", "answer": "2"},
        "",
        {"prompt": "2+2", "chosen": "#### 4", "rejected": "#### 5"},
        {"prompt": "1+1", "chosen": "1+1=2\n#### 2", "rejected": "#### 1"},
    )
    pairs = read_pairs(path)
    assert [(p.prompt, p.chosen, p.line) for p in pairs] == [
        ("1+1", "#### 2", 1),
        ("2+2", "#### 4", 3),
        ("1+1", "1+1=2\n#### 2", 4),
    ]
    problems = pair_problems(pairs)
    assert [(p.problem_id, p.question, p.answer) for p in problems] == [
        ("pairs-1", "1+1", "2"),
        ("pairs-3", "2+2", ""),  # no gold answer: the verifier calls both outputs wrong
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"pairs.jsonl:2: not JSON"),
        ('["a", "b"]', r"pairs.jsonl:2: a pair is a JSON object, not a list"),
        ('{"prompt": "q", "chosen": "a"}', r"pairs.jsonl:2: rejected must be a non-empty string"),
        ('{"prompt": "q", "chosen": " ", "rejected": "b"}', r":2: chosen must be a non-empty"),
        ('{"prompt": "q", "chosen": "a", "rejected": "b", "answer": 3}', r":2: answer must be"),
    ],
)
def test_a_bad_line_is_an_error_naming_file_and_line(
    tmp_path: Path, line: str, message: str
) -> None:
    path = write(tmp_path / "pairs.jsonl", {"prompt": "q", "chosen": "a", "rejected": "b"}, line)
    with pytest.raises(TaskDataError, match=message):
        read_pairs(path)


def test_a_missing_or_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TaskDataError, match="is not a file"):
        read_pairs(tmp_path / "none.jsonl")
    with pytest.raises(TaskDataError, match="holds no pair"):
        read_pairs(write(tmp_path / "empty.jsonl", ""))


def test_the_engine_answers_each_prompt_with_a_stored_pair_chosen_first() -> None:
    tokenizer = build_char_tokenizer()
    engine = PairsFileRollout(tokenizer, {"q1": [("12", "3")], "q2": [("4", "5"), ("6", "7")]})
    batch = engine.generate(["q1", "q2"], 2, PARAMS, seed=3)
    assert batch.prompt_index == [0, 0, 1, 1]
    assert batch.texts[:2] == ["12", "3"]
    assert batch.texts[2:] in (["4", "5"], ["6", "7"])
    eos = tokenizer.eos_token_id
    assert all(ids[-1] == eos for ids in batch.completion_ids)
    assert [len(ids) for ids in batch.completion_ids[:2]] == [3, 2]
    # the pair of a prompt with several is drawn from the seed: a resumed step draws the same
    assert engine.generate(["q1", "q2"], 2, PARAMS, seed=3).texts == batch.texts
    drawn = {tuple(engine.generate(["q2"], 2, PARAMS, seed=s).texts) for s in range(20)}
    assert drawn == {("4", "5"), ("6", "7")}
    with pytest.raises(ValueError, match="a group of 2 outputs"):
        engine.generate(["q1"], 4, PARAMS, seed=0)


def test_the_offline_estimator_prefers_the_first_output_of_each_pair() -> None:
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    sides = dpo_file_estimator(AdvantageInputs(response_mask=mask), 1e-4)
    assert sides.tolist() == [[1, 1], [-1, 0], [1, 0], [-1, -1]]
