"""LoRA adapters on the policy: only the adapters train, the reference is the base, the merged
export is the adapted model, and the adapters' files round-trip (grpo_core/model/lora.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.train import TorchEngine
from grpo_core.model import lora as lora_module
from grpo_core.model.config import LoRAConfig
from grpo_core.model.forward import sequence_logprobs
from grpo_core.model.lora import LoRAAdapters
from tests.models import tiny_llama

pytest.importorskip("peft", reason="the lora extra (pip install -e '.[lora]') is not installed")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

LORA = LoRAConfig(enabled=True, r=2, alpha=4)


def adapted(seed: int = 0, cfg: LoRAConfig = LORA) -> tuple[nn.Module, LoRAAdapters]:
    model = tiny_llama(vocab=16, tied=True)
    return model, LoRAAdapters(model, cfg, seed=seed)


def perturb(adapters: LoRAAdapters, seed: int = 1) -> None:
    """Adapters as after some training: B != 0, so the adapted model differs from the base."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapters.trainable():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def grouped_batch() -> tuple[PolicyBatch, torch.Tensor]:
    """2 prompts x 3 samples (rows share prompts: the KV-cache path) with group advantages."""
    prompts = [[1, 5, 6]] * 3 + [[1, 7]] * 3
    completions = [[3, 4, 2], [3, 2], [9, 9, 9, 2], [4, 2], [5, 6, 2], [2]]
    batch = build_policy_batch(prompts, completions, pad_id=0, padding_side="left")
    advantages = batch.expand_per_sequence(torch.tensor([1.0, -0.5, -0.5, 1.0, 0.0, -1.0]))
    return batch, advantages


def logits(model: nn.Module, batch: PolicyBatch) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    return out.logits


def test_update_trains_only_the_adapters() -> None:
    model, adapters = adapted()
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    engine = TorchEngine(model, OptimizerSettings(lr=1e-2))
    # the optimizer holds the adapters' A and B of 7 projections, nothing of the base
    assert {id(p) for p in engine.params} == {id(p) for p in adapters.trainable()}
    assert len(engine.params) == 2 * 7
    batch, advantages = grouped_batch()
    grpo_update(engine, adapters.reference(), batch, advantages, GRPOConfig(beta=0.04, mu=2))
    for name, param in model.named_parameters():
        if "lora_" in name:
            assert param.requires_grad, name
        else:
            assert not param.requires_grad, name
            assert torch.equal(param, base_before[name]), f"base weight {name} changed"
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert all(bool(b.abs().sum() > 0) for b in lora_b)  # every B left 0: the update trained


def test_new_adapters_leave_the_model_equal_to_the_base_and_are_seeded() -> None:
    batch, _ = grouped_batch()
    base = logits(tiny_llama(vocab=16, tied=True), batch)
    model, _ = adapted(seed=3)
    assert torch.equal(logits(model, batch), base)  # B = 0: the adapters add nothing yet
    a_of = {n: p.clone() for n, p in model.named_parameters() if "lora_A" in n}
    same = {n: p for n, p in adapted(seed=3)[0].named_parameters() if "lora_A" in n}
    other = {n: p for n, p in adapted(seed=4)[0].named_parameters() if "lora_A" in n}
    assert all(torch.equal(a_of[n], same[n]) for n in a_of)
    assert not any(torch.equal(a_of[n], other[n]) for n in a_of)


def test_reference_is_the_base_model_and_leaves_the_adapters_on() -> None:
    batch, _ = grouped_batch()
    base_model = tiny_llama(vocab=16, tied=True)
    model, adapters = adapted()
    perturb(adapters)
    model.train()
    reference = adapters.reference()
    reference.eval().requires_grad_(False)  # what a caller may do to a reference
    assert torch.equal(logits(reference, batch), logits(base_model, batch))
    # the shared-prompt KV-cache path of the log-probs, as grpo_update computes them (within
    # float rounding: peft's layers reach the same matmuls through another call path)
    torch.testing.assert_close(
        sequence_logprobs(reference, batch), sequence_logprobs(base_model, batch), atol=1e-6, rtol=0
    )
    assert model.training  # restored after the reference's eval-mode pass
    assert all(p.requires_grad for p in adapters.trainable())
    assert not torch.allclose(logits(model, batch), logits(base_model, batch))  # adapters on


def test_kl_to_the_reference_is_zero_until_the_adapters_move() -> None:
    batch, advantages = grouped_batch()
    cfg = GRPOConfig(beta=0.04)
    model, adapters = adapted()
    engine = TorchEngine(model, OptimizerSettings(lr=1e-2))
    first = grpo_update(engine, adapters.reference(), batch, advantages, cfg)
    assert first["kl"] == 0.0  # policy = base = reference: every log ratio is exactly 0
    second = grpo_update(engine, adapters.reference(), batch, advantages, cfg)
    assert second["kl"] > 0.0  # the adapters moved the policy away from the base


def test_merged_weights_are_the_adapted_model_under_the_base_keys() -> None:
    batch, _ = grouped_batch()
    model, adapters = adapted()
    perturb(adapters)
    merged = adapters.merged_state_dict()
    plain = tiny_llama(vocab=16, tied=True)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    torch.testing.assert_close(logits(plain, batch), logits(model, batch), atol=1e-5, rtol=1e-5)
    # not merged in place: the adapted model's base weights are still the original ones
    q_base = model.get_submodule("model.layers.0.self_attn.q_proj").base_layer.weight
    assert torch.equal(
        q_base, tiny_llama(vocab=16, tied=True).model.layers[0].self_attn.q_proj.weight
    )


@settings(max_examples=12, deadline=None)
@given(
    r=st.integers(1, 8),
    alpha=st.integers(1, 32),
    seed=st.integers(0, 2**16),
    targets=st.sets(
        st.sampled_from(["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]), min_size=1
    ),
)
def test_merging_never_changes_the_function(
    r: int, alpha: int, seed: int, targets: set[str]
) -> None:
    """Any rank, scale, adapter values and targets: the merged plain model computes what the
    adapted model computes (float rounding aside)."""
    batch, _ = grouped_batch()
    cfg = LoRAConfig(enabled=True, r=r, alpha=alpha, target_modules=sorted(targets))
    model, adapters = adapted(seed=seed, cfg=cfg)
    perturb(adapters, seed=seed)
    plain = tiny_llama(vocab=16, tied=True)
    plain.load_state_dict(adapters.merged_state_dict())
    torch.testing.assert_close(logits(plain, batch), logits(model, batch), atol=1e-4, rtol=1e-4)


def test_merged_weight_is_w_plus_alpha_over_r_b_a() -> None:
    model, adapters = adapted(cfg=LoRAConfig(enabled=True, r=1, alpha=2, target_modules=["q_proj"]))
    q = model.get_submodule("model.layers.0.self_attn.q_proj")
    with torch.no_grad():
        q.base_layer.weight.zero_()
        q.lora_A["default"].weight.zero_()
        q.lora_B["default"].weight.zero_()
        q.lora_A["default"].weight[0, :2] = torch.tensor([1.0, 2.0])  # A (1 x 16) = [1, 2, 0...]
        q.lora_B["default"].weight[:2, 0] = torch.tensor([3.0, -1.0])  # B (16 x 1) = [3, -1, 0..]
    merged = adapters.merged_state_dict()["model.layers.0.self_attn.q_proj.weight"]
    # W + (alpha / r) B A = 0 + (2 / 1) * [[3*1, 3*2], [-1*1, -1*2]] = [[6, 12], [-2, -4]]
    assert merged[:2, :2].tolist() == [[6.0, 12.0], [-2.0, -4.0]]
    assert int(merged.count_nonzero()) == 4


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")
def test_saved_adapters_load_back_and_open_with_peft(tmp_path: Path) -> None:
    from peft import PeftModel

    batch, _ = grouped_batch()
    model, adapters = adapted()
    perturb(adapters)
    adapters.save(tmp_path / "adapters")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in (tmp_path / "adapters").iterdir()
    }
    fresh, fresh_adapters = adapted(seed=9)
    fresh_adapters.load(tmp_path / "adapters")
    assert torch.equal(logits(fresh, batch), logits(model, batch))
    # PEFT's own loader on the base model: the files are ordinary PEFT adapters
    by_peft = PeftModel.from_pretrained(tiny_llama(vocab=16, tied=True), tmp_path / "adapters")
    torch.testing.assert_close(logits(by_peft, batch), logits(model, batch))


def test_adapters_of_other_settings_are_refused(tmp_path: Path) -> None:
    _, adapters = adapted()
    adapters.save(tmp_path / "adapters")
    _, wider = adapted(cfg=LoRAConfig(enabled=True, r=4, alpha=4))
    with pytest.raises(SettingError, match=r"other grpo.lora settings.*'r': \(2, 4\)"):
        wider.load(tmp_path / "adapters")


def test_unknown_target_module_names_the_field_and_the_choices() -> None:
    cfg = LoRAConfig(enabled=True, target_modules=["q_proj", "qkv_proj"])
    with pytest.raises(SettingError, match=r"grpo.lora.target_modules names \['qkv_proj'\]") as e:
        adapted(cfg=cfg)
    assert "'down_proj'" in str(e.value) and "'q_proj'" in str(e.value)


def test_missing_peft_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lora_module, "find_spec", lambda name: None)
    with pytest.raises(SettingError, match=r"pip install -e '\.\[lora\]'.*grpo.lora.enabled"):
        lora_module.require_peft()
