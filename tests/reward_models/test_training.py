"""RM training: examples from label rows, what the trainer saw, replay mix, continual restarts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from grpo_core.model.checkpointing import is_checkpointing
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from reward_models.config import RewardModelConfig
from reward_models.labelling import OrmLabel, PrmLabel
from reward_models.models import RewardModel, load_or_init_reward_model
from reward_models.training import (
    RMExample,
    SampleText,
    check_training_mix,
    orm_examples,
    prm_examples,
    train_reward_model,
)
from reward_models.views import RMEncoder, RMInput
from tests.recording_engine import RecordingEngine, assert_same_gradients

TOKENIZER = build_char_tokenizer()
SMALL = PolicyConfig(n_layers=1, hidden_size=32, n_heads=2, intermediate_size=64, seed=1)
PROMPT = "Q: 3+4-2\nA:\n"


def fresh_rm(kind: str = "orm") -> RewardModel:
    policy = create_tiny_policy(SMALL, TOKENIZER)
    return RewardModel.from_policy(policy, kind, TOKENIZER)  # type: ignore[arg-type]


def orm_set(n: int, source: str, iteration: int, start: int = 0) -> list[RMExample]:
    """n ORM examples with distinct completions (sample index start..); odd ones correct."""
    indices = range(start, start + n)
    texts = {("p", i): SampleText(PROMPT, f"3+4=7\n7-2={i}\n#### {i}") for i in indices}
    rows = [OrmLabel("p", i, i % 2) for i in indices]
    return orm_examples(rows, texts, RMEncoder(TOKENIZER), source, iteration)  # type: ignore[arg-type]


def test_orm_example_reads_the_last_completion_token() -> None:
    (example,) = orm_set(1, "new", 0)
    assert example.prompt_ids == TOKENIZER(PROMPT)["input_ids"]
    assert example.read_positions == [len("3+4=7\n7-2=0\n#### 0") - 1]
    assert (example.targets, example.step_indices) == ([0.0], None)


def test_prm_example_recomputes_step_ends_from_the_text() -> None:
    def row(step: int, soft: float) -> PrmLabel:
        return PrmLabel("p", 3, step, "?", 0, 4, round(4 * soft), 1, soft, None)

    texts = {("p", 3): SampleText(PROMPT, "3+4=7\n7-2=5\n#### 5")}
    rows = [row(2, 0.5), row(0, 0.75)]  # a replay sample may hold only some steps
    (hard,) = prm_examples(rows, texts, RMEncoder(TOKENIZER), "hard", "replay", 1)
    (soft,) = prm_examples(rows, texts, RMEncoder(TOKENIZER), "soft", "replay", 1)
    assert hard.read_positions == [4, 17]
    assert (hard.step_indices, hard.targets, soft.targets) == ([0, 2], [1.0, 1.0], [0.75, 0.5])
    with pytest.raises(KeyError, match="p#9"):
        prm_examples(
            [PrmLabel("p", 9, 0, "?", 0, 0, 0, 0, 0.0)],
            texts,
            RMEncoder(TOKENIZER),
            "hard",
            "new",
            1,
        )


def test_trained_rows_are_exactly_what_the_trainer_saw() -> None:
    rm = fresh_rm()
    examples = orm_set(7, "new", 2) + orm_set(3, "replay", 1, start=100)
    by_ids = {tuple(e.prompt_ids + e.completion_ids): e for e in examples}
    seen: list[RMExample] = []
    forward = rm.forward

    def spy(
        input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            seen.append(by_ids[tuple(i for i, m in zip(ids, mask, strict=True) if m)])
        return forward(input_ids, attention_mask, position_ids)

    rm.forward = spy  # type: ignore[method-assign]
    cfg = RewardModelConfig(epochs=2, batch_size=4, lr=1e-3)
    metrics, records = train_reward_model(rm, examples, cfg, seed=0, progress=False)

    assert [(r.problem_id, r.sample_index, r.source) for r in records] == [
        (e.problem_id, e.sample_index, e.source) for e in seen
    ]
    assert [r.label for r in records] == [e.targets[0] for e in seen]
    assert Counter((r.source, r.origin_iteration, r.epoch) for r in records) == {
        ("new", 2, 0): 7,
        ("replay", 1, 0): 3,
        ("new", 2, 1): 7,
        ("replay", 1, 1): 3,
    }
    assert {r.rm_kind for r in records} == {"orm"} and {r.step_index for r in records} == {None}
    assert metrics["steps"] == 6 and metrics["examples_replay"] == 3
    assert [e.sample_index for e in seen[:10]] != [e.sample_index for e in examples]  # shuffled


def test_prm_records_list_every_step_target() -> None:
    rm = fresh_rm("prm")
    texts = {("p", 0): SampleText(PROMPT, "3+4=7\n7-2=5\n#### 5")}
    rows = [PrmLabel("p", 0, j, "?", 0, 4, 4, 1, 1.0, 1) for j in range(3)]
    examples = prm_examples(rows, texts, RMEncoder(TOKENIZER), "soft", "new", 0)
    _, records = train_reward_model(rm, examples, RewardModelConfig(), seed=0, progress=False)
    assert [(r.rm_kind, r.step_index, r.label, r.epoch) for r in records] == [
        ("prm", 0, 1.0, 0),
        ("prm", 1, 1.0, 0),
        ("prm", 2, 1.0, 0),
    ]


def test_training_lowers_the_loss_and_is_seeded() -> None:
    cfg = RewardModelConfig(epochs=6, batch_size=4, lr=3e-3)
    runs = [
        train_reward_model(fresh_rm(), orm_set(8, "new", 0), cfg, seed=4, progress=False)
        for _ in range(2)
    ]
    (m1, r1), (m2, r2) = runs
    assert m1["loss_last_epoch"] < m1["loss_first_epoch"]
    assert m1 == m2 and r1 == r2


def test_continual_training_starts_from_the_saved_model(tmp_path: Path) -> None:
    rm = fresh_rm()
    cfg = RewardModelConfig(epochs=3, batch_size=4, lr=3e-3)
    train_reward_model(rm, orm_set(8, "new", 0), cfg, seed=0, progress=False)
    rm.save(tmp_path / "iter-0")
    resumed = load_or_init_reward_model(tmp_path / "iter-0", "unused-policy-dir", "orm")
    trained = rm.state_dict()
    assert all(torch.equal(w, trained[k]) for k, w in resumed.state_dict().items())
    assert not torch.equal(resumed.net.score.weight, fresh_rm().net.score.weight)


def test_mix_check_rejects_replay_from_the_current_iteration() -> None:
    check_training_mix(orm_set(2, "new", 3) + orm_set(1, "replay", 0), iteration=3)
    with pytest.raises(ValueError, match="replay example p#0 comes from iteration 3"):
        check_training_mix(orm_set(1, "replay", 3), iteration=3)
    with pytest.raises(ValueError, match="new example"):
        check_training_mix(orm_set(1, "new", 2), iteration=3)


def test_bad_examples_are_rejected() -> None:
    with pytest.raises(ValueError, match="targets must be in"):
        RMExample("orm", [1], [5], [0], [float("nan")], "p", 0, None, "new", 0, "orm_labels")
    with pytest.raises(ValueError, match="max_length"):
        train_reward_model(fresh_rm(), orm_set(1, "new", 0), RewardModelConfig(max_length=8), 0)
    with pytest.raises(ValueError, match="no reward-model training examples"):
        train_reward_model(fresh_rm(), [], RewardModelConfig(), 0)


def test_each_distinct_text_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = RMEncoder(TOKENIZER)
    calls: list[tuple[str, str]] = []
    encode = RMEncoder.encode

    def counted(self: RMEncoder, prompt: str, completion: str) -> RMInput:
        calls.append((prompt, completion))
        return encode(self, prompt, completion)

    monkeypatch.setattr(RMEncoder, "encode", counted)
    texts = {("p", i): SampleText(PROMPT, f"3+4=7\n7-2={i % 2}\n#### {i % 2}") for i in range(6)}
    rows = [OrmLabel("p", i, i % 2) for i in range(6)]
    examples = orm_examples(rows, texts, encoder, "new", 0)
    assert len(calls) == 2  # six outputs, two distinct texts
    for row, example in zip(rows, examples, strict=True):
        alone = encode(encoder, *texts["p", row.sample_index])
        assert example.completion_ids == alone.completion_ids
        assert example.read_positions == [alone.outcome_position]
        assert example.sample_index == row.sample_index


def test_gradient_checkpointing_keeps_the_loss_and_gradients() -> None:
    runs = []
    for checkpointing in (False, True):
        cfg = RewardModelConfig(epochs=2, batch_size=4, gradient_checkpointing=checkpointing)
        model = fresh_rm()
        engine = RecordingEngine(model)
        metrics, _ = train_reward_model(
            model, orm_set(8, "new", 0), cfg, seed=4, progress=False, engine=engine
        )
        assert is_checkpointing(model.net) == checkpointing
        runs.append((metrics, engine.grads))
    (plain_metrics, plain_grads), (metrics, grads) = runs
    assert metrics["loss_last_epoch"] == pytest.approx(plain_metrics["loss_last_epoch"], abs=1e-6)
    assert_same_gradients(grads, plain_grads, atol=1e-6)


def test_bf16_mixed_trains_float32_weights_with_bfloat16_forwards() -> None:
    """reward_models.dtype bf16-mixed: the RM's parameters stay float32, training's forwards
    compute in bfloat16, and it learns as float32 does (first-epoch loss measured 2e-6 from
    float32's: BCE and the picked scores run in float32 under autocast; held to 1e-4)."""
    runs = {}
    for dtype in ("float32", "bf16-mixed"):
        cfg = RewardModelConfig(epochs=3, batch_size=4, lr=3e-3, dtype=dtype)
        model = fresh_rm()
        seen: list[torch.dtype] = []
        model.net.score.register_forward_hook(lambda _m, _a, out, seen=seen: seen.append(out.dtype))
        metrics, _ = train_reward_model(model, orm_set(8, "new", 0), cfg, seed=4, progress=False)
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert metrics["loss_last_epoch"] < metrics["loss_first_epoch"]
        runs[dtype] = (metrics["loss_first_epoch"], set(seen))
    assert runs["float32"][1] == {torch.float32} and runs["bf16-mixed"][1] == {torch.bfloat16}
    assert runs["bf16-mixed"][0] != runs["float32"][0]
    assert runs["bf16-mixed"][0] == pytest.approx(runs["float32"][0], abs=1e-4)
