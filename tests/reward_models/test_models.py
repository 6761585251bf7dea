"""Reward models: backbone copied from the policy, HF save/load, continual-training restarts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from reward_models.models import META_FILE, RewardModel, load_or_init_reward_model

SMALL = PolicyConfig(n_layers=1, hidden_size=32, n_heads=2, intermediate_size=64, seed=1)


def tiny_policy() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tokenizer = build_char_tokenizer()
    return create_tiny_policy(SMALL, tokenizer), tokenizer


def test_backbone_is_copied_from_the_policy_model() -> None:
    policy, tokenizer = tiny_policy()
    rm = RewardModel.from_policy(policy, "orm", tokenizer)
    for name, weight in policy.model.state_dict().items():
        assert torch.equal(rm.net.model.state_dict()[name], weight), name
    ids = torch.tensor([tokenizer("Q: 1+1\nA:\n1+1=2")["input_ids"]])
    scores = rm(ids, torch.ones_like(ids))
    assert scores.shape == ids.shape


def test_backbone_is_loaded_from_a_policy_directory(tmp_path: Path) -> None:
    policy, tokenizer = tiny_policy()
    policy.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    rm = RewardModel.from_policy(tmp_path / "policy", "prm")
    emb = policy.model.embed_tokens.weight
    assert torch.equal(rm.net.model.embed_tokens.weight, emb)
    assert rm.kind == "prm" and rm.tokenizer.pad_token == "<pad>"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        RewardModel.from_policy(tmp_path / "nowhere", "orm")


def test_save_and_load_round_trip_the_weights_in_hf_format(tmp_path: Path) -> None:
    policy, tokenizer = tiny_policy()
    rm = RewardModel.from_policy(policy, "prm", tokenizer, seed=5)
    with torch.no_grad():
        rm.net.score.weight.add_(1.0)
    rm.save(tmp_path / "rm")
    assert (tmp_path / "rm" / "model.safetensors").is_file()
    loaded = load_or_init_reward_model(tmp_path / "rm", policy, "prm")
    assert loaded.kind == "prm"
    saved = rm.state_dict()
    for name, weight in loaded.state_dict().items():
        assert torch.equal(weight, saved[name]), name


def test_missing_previous_checkpoint_is_an_error_naming_the_path(tmp_path: Path) -> None:
    policy, tokenizer = tiny_policy()
    missing = tmp_path / "checkpoints" / "rm_orm" / "iter-0"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_or_init_reward_model(missing, policy, "orm", tokenizer=tokenizer)


def test_previous_checkpoint_of_the_other_kind_is_rejected(tmp_path: Path) -> None:
    policy, tokenizer = tiny_policy()
    RewardModel.from_policy(policy, "orm", tokenizer).save(tmp_path / "rm")
    with pytest.raises(ValueError, match="is a orm, expected a prm"):
        load_or_init_reward_model(tmp_path / "rm", policy, "prm")


def test_without_previous_checkpoint_a_fresh_seeded_head_is_made() -> None:
    policy, tokenizer = tiny_policy()
    a = load_or_init_reward_model(None, policy, "orm", tokenizer=tokenizer, seed=2)
    b = load_or_init_reward_model(None, policy, "orm", tokenizer=tokenizer, seed=2)
    assert torch.equal(a.net.score.weight, b.net.score.weight)


def test_tokenizer_without_pad_token_pads_with_eos_and_warns() -> None:
    policy, tokenizer = tiny_policy()
    tokenizer.pad_token = None
    with pytest.warns(UserWarning, match="no pad token"):
        rm = RewardModel.from_policy(policy, "orm", tokenizer)
    assert rm.tokenizer.pad_token == rm.tokenizer.eos_token == "<eos>"
    assert rm.net.config.pad_token_id == tokenizer.eos_token_id


def test_a_checkpoint_saved_before_formats_existed_loads_as_scalar_head(tmp_path: Path) -> None:
    policy, tokenizer = tiny_policy()
    rm = RewardModel.from_policy(policy, "orm", tokenizer, seed=5)
    rm.save(tmp_path / "rm")
    assert json.loads((tmp_path / "rm" / META_FILE).read_text())["format"] == "scalar_head"
    (tmp_path / "rm" / META_FILE).write_text('{"kind": "orm"}\n')  # as earlier versions wrote
    loaded = RewardModel.load(tmp_path / "rm")
    assert (loaded.kind, loaded.format, loaded.tokens) == ("orm", "scalar_head", {})
    ids = torch.tensor([tokenizer("Q: 1+1\nA:\n1+1=2")["input_ids"]])
    assert torch.equal(loaded(ids, torch.ones_like(ids)), rm(ids, torch.ones_like(ids)))
