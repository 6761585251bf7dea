import random

import pytest

from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Problem
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.model.config import PolicyConfig, WarmStartConfig
from grpo_core.model.policy import build_char_tokenizer, build_policy, create_tiny_policy
from grpo_core.model.warm_start import inject_step_error, sft_batch, training_text, warm_start


def test_sft_batch_trains_on_completion_tokens_and_eos_only() -> None:
    tok = build_char_tokenizer()
    batch = sft_batch(tok, ["Q: 1+1\nA:\n", "Q: 9\nA:\n"], ["#### 2", "#### 9"])
    labels = batch["labels"]
    assert labels.shape == batch["input_ids"].shape
    first = labels[0][labels[0] != -100].tolist()
    assert first == [*tok("#### 2", add_special_tokens=False)["input_ids"], tok.eos_token_id]
    assert int(batch["attention_mask"][1].sum()) == len("Q: 9\nA:\n") + 1 + len("#### 9") + 1


def test_error_rate_controls_wrong_solutions() -> None:
    task, rng = ArithTask(), random.Random(0)
    problems = task.problems("train", 2000, 0)
    texts = [training_text(task, p, 0.3, rng) for p in problems]
    wrong = sum(not task.is_correct(p, t) for p, t in zip(problems, texts, strict=True))
    assert wrong / len(problems) == pytest.approx(0.3, abs=0.04)


def test_generic_error_injection_changes_one_step() -> None:
    solution = "Tom has 3+4=7 apples\nHe eats 2: 7-2=5\n#### 5"
    bad = inject_step_error(solution, random.Random(1))
    changed = [a != b for a, b in zip(solution.split("\n"), bad.split("\n"), strict=True)]
    assert sum(changed) == 1 and not changed[-1]


def test_warm_start_requires_solutions() -> None:
    class NoSolutions(ArithTask):
        def problems(self, split, n, seed):  # type: ignore[no-untyped-def]
            return [Problem("a", "1+1", "2")] * n

    tok = build_char_tokenizer()
    model = create_tiny_policy(PolicyConfig(n_layers=1), tok)
    with pytest.raises(ValueError, match="gold solutions"):
        warm_start(
            model, tok, NoSolutions(), WarmStartConfig(steps=1, eval_prompts=0), progress=False
        )


def test_short_warm_start_reduces_loss() -> None:
    model, tok = build_policy(PolicyConfig(n_layers=1))
    cfg = WarmStartConfig(steps=30, batch_size=16, eval_prompts=8)
    greedy = HFRolloutEngine(model, tok, show_progress=False)
    metrics = warm_start(model, tok, ArithTask(), cfg, progress=False, greedy_sampler=greedy)
    assert metrics["steps"] == 30 and metrics["loss"] < 2.5
    assert 0.0 <= metrics["greedy_accuracy"] <= 1.0


@pytest.mark.slow
def test_default_warm_start_lands_in_target_band() -> None:
    model, tok = build_policy(PolicyConfig())
    greedy = HFRolloutEngine(model, tok, show_progress=False)
    cfg = WarmStartConfig(eval_prompts=400)
    metrics = warm_start(model, tok, ArithTask(), cfg, progress=False, greedy_sampler=greedy)
    print(metrics)
    assert 0.3 <= metrics["greedy_accuracy"] <= 0.7
