"""One scalar-head network (grpo_core/model/scalar_head.py) for PPO's critic and the scalar_head
reward models: the same seed gives both the same head, drawn as transformers draws a new
one-label token head, and checkpoints written in their known layout (HF safetensors keys
`model.*` and `score.*`, plus each one's marker file) load into both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForTokenClassification

from grpo_core.model.critic import CRITIC_FILE, ValueModel
from grpo_core.model.policy import build_char_tokenizer
from reward_models.models import META_FILE, RewardModel
from tests.models import tiny_llama


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    path = tmp_path / "policy"
    tiny_llama(seed=3, vocab=100).save_pretrained(path)
    build_char_tokenizer().save_pretrained(path)
    return path


def _transformers_head(path: Path, seed: int) -> AutoModelForTokenClassification:
    """A new one-label token head on path's backbone as transformers itself draws it after
    torch.manual_seed(seed): the recipe critics and reward models were built by."""
    config = AutoConfig.from_pretrained(path)
    config.num_labels, config.classifier_dropout, config.architectures = 1, 0.0, None
    torch.manual_seed(seed)
    return AutoModelForTokenClassification.from_pretrained(path, config=config)


def test_the_critic_and_the_reward_model_are_one_network_drawn_as_transformers_draws_it(
    policy_dir: Path,
) -> None:
    critic = ValueModel.from_backbone(policy_dir, seed=5)
    rm = RewardModel.from_policy(policy_dir, "orm", seed=5)
    expected = _transformers_head(policy_dir, seed=5).state_dict()
    for net in (critic.net, rm.net):
        weights = net.state_dict()
        assert weights.keys() == expected.keys()
        assert all(torch.equal(weights[name], expected[name]) for name in expected)
    rm_in_memory = RewardModel.from_policy(
        tiny_llama(seed=3, vocab=100), "orm", build_char_tokenizer(), seed=5
    )
    backbone = rm_in_memory.net.base_model.state_dict()
    assert all(torch.equal(backbone[n], w) for n, w in rm.net.base_model.state_dict().items())


def test_checkpoints_in_the_known_layout_load_as_critic_and_reward_model(tmp_path: Path) -> None:
    """Written without our code (transformers' save and the marker files as earlier versions
    wrote them), so a critic or RM stored by an earlier version loads unchanged."""
    net = _transformers_head_on_tiny(tmp_path / "policy")
    stored = tmp_path / "stored"
    net.save_pretrained(stored)
    build_char_tokenizer().save_pretrained(stored)
    (stored / CRITIC_FILE).write_text('{"head": "scalar"}\n')
    (stored / META_FILE).write_text('{"kind": "orm", "format": "scalar_head", "tokens": {}}\n')
    keys = set(load_file(stored / "model.safetensors"))
    assert {"score.weight", "score.bias"} <= keys and all(
        k.startswith(("model.", "score.")) for k in keys
    )

    critic, rm = ValueModel.load(stored), RewardModel.load(stored)
    for loaded in (critic.net, rm.net):
        assert all(torch.equal(loaded.state_dict()[n], w) for n, w in net.state_dict().items())
    for saved in (critic.save(tmp_path / "critic"), rm.save(tmp_path / "rm")):
        assert set(load_file(saved / "model.safetensors")) == keys
    assert json.loads((tmp_path / "critic" / CRITIC_FILE).read_text()) == {"head": "scalar"}
    assert json.loads((tmp_path / "rm" / META_FILE).read_text())["format"] == "scalar_head"


def _transformers_head_on_tiny(path: Path) -> AutoModelForTokenClassification:
    tiny_llama(seed=4, vocab=100).save_pretrained(path)
    return _transformers_head(path, seed=9)
