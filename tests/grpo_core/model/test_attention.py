"""policy.attn_implementation: the kernels asked for reach every way the policy is built or
loaded (the tiny policy, a checkpoint, the PPO critic), compute the log-probs the default
kernels compute, and the flash-attention kernels are refused where they cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import grpo_core.model.attention as attention
from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.model.attention import require_attn_implementation
from grpo_core.model.config import PolicyConfig
from grpo_core.model.critic import ValueModel
from grpo_core.model.forward import sequence_logprobs
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy, load_policy


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    tokenizer = build_char_tokenizer()
    create_tiny_policy(PolicyConfig(seed=5), tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_eager_and_sdpa_give_the_same_logprobs_on_a_padded_batch() -> None:
    tokenizer = build_char_tokenizer()
    # rows of different lengths: padding and its mask go through both kernels
    prompts = [[1, 10, 11, 12], [1, 13], [1, 14, 15, 16, 17, 18]]
    completions = [[20, 21, 22, 2], [23, 24, 25, 26, 27, 28, 2], [29]]
    batch = build_policy_batch(prompts, completions, tokenizer.pad_token_id)
    logprobs = {}
    for kernel in ("eager", "sdpa"):
        model = create_tiny_policy(PolicyConfig(seed=5, attn_implementation=kernel), tokenizer)
        assert model.config._attn_implementation == kernel
        with torch.no_grad():
            logprobs[kernel] = sequence_logprobs(model.eval(), batch)
    assert logprobs["eager"].abs().sum() > 0
    torch.testing.assert_close(logprobs["eager"], logprobs["sdpa"], atol=1e-5, rtol=0)


def test_the_default_leaves_the_models_own_kernels_and_draws_the_same_weights() -> None:
    tokenizer = build_char_tokenizer()
    default = create_tiny_policy(PolicyConfig(seed=5), tokenizer)
    eager = create_tiny_policy(PolicyConfig(seed=5, attn_implementation="eager"), tokenizer)
    assert default.config._attn_implementation == "sdpa"  # transformers' choice on this torch
    for a, b in zip(default.parameters(), eager.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_loaded_checkpoint_runs_the_kernels_asked_for_at_each_load(policy_dir: Path) -> None:
    # a checkpoint does not record them: a later stage's load passes the setting again
    assert load_policy(policy_dir)[0].config._attn_implementation == "sdpa"
    model, _ = load_policy(policy_dir, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    skeleton, _ = load_policy(policy_dir, weights=False, attn_implementation="eager")
    assert skeleton.config._attn_implementation == "eager"


def test_the_ppo_critic_from_the_policy_runs_the_policys_kernels(
    policy_dir: Path, tmp_path: Path
) -> None:
    critic = ValueModel.from_backbone(policy_dir, attn_implementation="eager")
    assert critic.net.config._attn_implementation == "eager"
    saved = critic.save(tmp_path / "critic")
    reloaded = ValueModel.load(saved, attn_implementation="eager")
    assert reloaded.net.config._attn_implementation == "eager"
    assert ValueModel.load(saved).net.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("name", [None, "sdpa", "eager"])
@pytest.mark.parametrize("cuda", [False, True])
def test_the_kernels_torch_has_run_anywhere_without_a_package_lookup(
    name: str | None, cuda: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[str] = []
    monkeypatch.setattr(attention, "find_spec", looked_up.append)
    assert require_attn_implementation(name, cuda=cuda) is None  # accepted: nothing raised
    assert looked_up == []  # torch's own kernels need no flash-attention package


@pytest.mark.parametrize("name", ["flash_attention_2", "flash_attention_3"])
def test_flash_attention_without_cuda_is_refused_naming_the_field(name: str) -> None:
    with pytest.raises(SettingError, match=rf"policy\.attn_implementation = {name} runs on CUDA"):
        require_attn_implementation(name, cuda=False)


def test_flash_attention_without_its_package_is_refused_naming_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked_up: list[str] = []

    def not_installed(module: str) -> None:
        looked_up.append(module)
        return None

    monkeypatch.setattr(attention, "find_spec", not_installed)
    with pytest.raises(SettingError, match=r"needs the flash-attn package.*pip install flash-attn"):
        require_attn_implementation("flash_attention_2", cuda=True)
    assert looked_up == ["flash_attn"]  # located, never imported
