"""Scoring API: outcome scores at the last token, step scores at step-end tokens, batched."""

from __future__ import annotations

import pytest
import torch

from grpo_core.data.reasoning_steps import step_end_token_indices
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from reward_models.models import RewardModel
from reward_models.parts.prm import fold_step_scores
from reward_models.scoring import score_outcome, score_steps

TOKENIZER = build_char_tokenizer()
SMALL = PolicyConfig(n_layers=1, hidden_size=32, n_heads=2, intermediate_size=64, seed=1)
PROMPTS = ["Q: 3+4-2\nA:\n", "Q: 1+1\nA:\n", "Q: 9-8+7\nA:\n"]
COMPLETIONS = ["3+4=7\n7-2=5\n#### 5", "1+1=2\n#### 2", ""]


def rm() -> RewardModel:
    return RewardModel.from_policy(create_tiny_policy(SMALL, TOKENIZER), "orm", TOKENIZER, seed=3)


def single_forward(model: RewardModel, prompt: str, completion: str) -> torch.Tensor:
    ids = (
        TOKENIZER(prompt)["input_ids"]
        + TOKENIZER(completion, add_special_tokens=False)["input_ids"]
    )
    x = torch.tensor([ids])
    with torch.no_grad():
        return torch.sigmoid(model(x, torch.ones_like(x)))[0]


def test_outcome_scores_are_last_token_probabilities_independent_of_batching() -> None:
    model = rm()
    model.train()
    one = score_outcome(model, PROMPTS, COMPLETIONS, batch_size=1)
    three = score_outcome(model, PROMPTS, COMPLETIONS, batch_size=3)
    assert one.shape == (3,) and torch.allclose(one, three, atol=1e-5)
    expected = [
        float(single_forward(model, p, c)[-1]) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)
    ]
    assert torch.allclose(three, torch.tensor(expected), atol=1e-5)
    assert model.training  # the caller's mode is restored


def test_copies_of_an_output_are_scored_once_and_all_get_its_scores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = rm()
    forwarded: list[int] = []
    forward = model.forward

    def counted(*args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        forwarded.append(len(args[0]))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counted)
    order = [1, 0, 1, 2, 1, 0]  # copies of outputs 0 and 1, in any order
    prompts, completions = [PROMPTS[i] for i in order], [COMPLETIONS[i] for i in order]
    alone = score_outcome(model, PROMPTS, COMPLETIONS, batch_size=8)
    forwarded.clear()
    copied = score_outcome(model, prompts, completions, batch_size=8)
    assert forwarded == [3]  # one pass over the three distinct outputs
    assert copied.tolist() == [alone[i].item() for i in order]
    steps = score_steps(model, prompts, completions, batch_size=2)
    assert steps.step_end_tokens == [[4, 11], [4, 10, 17], [4, 11], [], [4, 11], [4, 10, 17]]
    assert steps.scores[0] == steps.scores[2] == steps.scores[4]
    assert steps.scores[0] is not steps.scores[2]  # each row its own list
    # the same completion under another prompt is another output
    other = score_outcome(model, [PROMPTS[0], PROMPTS[1]], [COMPLETIONS[1]] * 2, batch_size=8)
    assert other[0].item() != other[1].item()


def test_step_scores_are_read_at_step_end_tokens() -> None:
    model = rm()
    out = score_steps(model, PROMPTS, COMPLETIONS, batch_size=2)
    assert out.step_end_tokens == [[4, 10, 17], [4, 11], []]
    ids = TOKENIZER(COMPLETIONS[1], add_special_tokens=False)["input_ids"]
    assert out.step_end_tokens[1] == step_end_token_indices(ids, TOKENIZER)
    full = single_forward(model, PROMPTS[0], COMPLETIONS[0])
    prompt_len = len(TOKENIZER(PROMPTS[0])["input_ids"])
    expected = [float(full[prompt_len + i]) for i in (4, 10, 17)]
    assert torch.allclose(torch.tensor(out.scores[0]), torch.tensor(expected), atol=1e-5)
    assert out.scores[2] == []


def test_prm_outcome_score_folds_steps_by_min_mean_or_last() -> None:
    steps = [[0.9, 0.2, 0.6], [0.5], []]
    assert fold_step_scores(steps, "min") == pytest.approx([0.2, 0.5, 0.0])
    assert fold_step_scores(steps, "mean") == pytest.approx([1.7 / 3, 0.5, 0.0])
    assert fold_step_scores(steps, "last") == pytest.approx([0.6, 0.5, 0.0])
    with pytest.raises(ValueError, match="'min', 'mean' or 'last'"):
        fold_step_scores(steps, "max")  # type: ignore[arg-type]
