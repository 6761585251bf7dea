"""The teacher of on-policy distillation: its log-probs of the student's sampled tokens, its
loading from a checkpoint, and the tokenizer check of the pre-flight."""

from pathlib import Path

import pytest
import torch
from tokenizers import processors

from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from grpo_core.model.teacher import Teacher, load_teacher, tokenizer_mismatch
from tests.models import tiny_llama


def by_hand(
    model: torch.nn.Module, prompt: list[int], completion: list[int], t: float
) -> list[float]:
    """log p(y_t | q, y_<t) of one unpadded row, from the logits divided by t."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = (model(ids).logits[0] / t).log_softmax(-1)
    start = len(prompt)
    return [float(logp[start + i - 1, tok]) for i, tok in enumerate(completion)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_are_each_rows_own_at_the_samplers_temperature(temperature: float) -> None:
    model = tiny_llama(seed=3, vocab=12).eval()
    teacher = Teacher(model, pad_token_id=0)
    prompts = [[1, 2, 3], [1, 4], [1, 5, 6, 7]]
    completions = [[8, 9], [10, 11, 2, 3], []]  # ragged, one empty: padding changes nothing
    got = teacher.token_logprobs(prompts, completions, temperature)
    assert [len(row) for row in got] == [2, 4, 0]
    for row, prompt, completion in zip(got, prompts, completions, strict=True):
        assert row == pytest.approx(by_hand(model, prompt, completion, temperature), abs=1e-5)
    assert teacher.token_logprobs([], [], 1.0) == []


def test_a_saved_policy_loads_as_a_frozen_teacher(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    policy = create_tiny_policy(PolicyConfig(n_layers=1, hidden_size=16, n_heads=2), tokenizer)
    policy.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    teacher = load_teacher(tmp_path, "cpu", micro_batch_size=1)
    assert not teacher.model.training
    assert not any(p.requires_grad for p in teacher.model.parameters())
    assert teacher.pad_token_id == tokenizer.pad_token_id
    prompt, completion = tokenizer("1+1=")["input_ids"], tokenizer("2")["input_ids"][1:]
    (row,) = teacher.token_logprobs([prompt], [completion], 1.0)
    assert row == pytest.approx(by_hand(policy, prompt, completion, 1.0), abs=1e-5)


def test_the_tokenizer_check_accepts_the_same_vocabulary_and_names_a_difference() -> None:
    student = build_char_tokenizer()
    prompts = ["What is 1+2?\n", "Solve: 2+2"]
    assert tokenizer_mismatch(build_char_tokenizer(), student, prompts) is None
    # the same characters in another order: every id moves
    shuffled = build_char_tokenizer("0123456789" + "".join(reversed("+-*/=?: \nabc")))
    why = tokenizer_mismatch(shuffled, build_char_tokenizer("0123456789+-*/=?: \nabc"), prompts)
    assert why is not None and why.startswith("their vocabularies differ (")
    assert "tokens differ, e.g." in why


def test_the_tokenizer_check_names_a_prompt_the_two_encode_otherwise() -> None:
    # one vocabulary, but the teacher's tokenizer does not prepend <bos>
    teacher = build_char_tokenizer()
    teacher.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A", pair="$A $B"
    )
    why = tokenizer_mismatch(teacher, build_char_tokenizer(), ["1+1="])
    assert why is not None and why.startswith("they encode the prompt '1+1=' to different ids")
