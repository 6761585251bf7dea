"""PPO's value model: where its backbone and head come from, what it reads at which token,
and its checkpoints (safetensors, dtype honoured)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForTokenClassification

from grpo_core.contracts.errors import MissingPathError
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.model.critic import ValueModel
from tests.models import tiny_llama


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    path = tmp_path / "policy"
    tiny_llama(seed=3).save_pretrained(path)
    return path


def test_a_critic_from_the_policy_has_its_backbone_a_new_seeded_head_and_leaves_the_rng(
    policy_dir: Path,
) -> None:
    rng = torch.get_rng_state()
    critic = ValueModel.from_backbone(policy_dir, seed=5)
    assert torch.equal(torch.get_rng_state(), rng)  # the head's draw is private
    policy = tiny_llama(seed=3)
    for name, weight in policy.model.state_dict().items():
        assert torch.equal(critic.net.model.state_dict()[name], weight), name
    same = ValueModel.from_backbone(policy_dir, seed=5)
    other = ValueModel.from_backbone(policy_dir, seed=6)
    assert torch.equal(critic.net.score.weight, same.net.score.weight)
    assert not torch.equal(critic.net.score.weight, other.net.score.weight)
    assert critic.net.score.weight.shape == (1, 16)


def test_the_value_of_token_j_is_read_before_it_and_padding_does_not_change_it(
    policy_dir: Path,
) -> None:
    critic = ValueModel.from_backbone(policy_dir)
    right = build_policy_batch([[1, 2], [3]], [[4, 5, 6], [7]], pad_id=0)
    left = build_policy_batch([[1, 2], [3]], [[4, 5, 6], [7]], pad_id=0, padding_side="left")
    with torch.no_grad():
        values = critic(right)
        hidden = critic.net.model(input_ids=torch.tensor([[1, 2, 4, 5, 6]])).last_hidden_state
        head = critic.net.score(hidden)[0, :, 0]
        values_left = critic(left)
    # row 0: prompt [1, 2], completion at columns 2..4: V(token j) = head(hidden[j - 1])
    assert torch.allclose(values[0, 2:], head[1:4], atol=1e-6)
    assert values[0, :2].tolist() == [0.0, 0.0] and values[1, 2:].tolist() == [0.0, 0.0, 0.0]
    packed = right.full_to_response(values), left.full_to_response(values_left)
    assert torch.allclose(*packed, atol=1e-5)


def test_a_scalar_head_orm_keeps_its_head(tmp_path: Path) -> None:
    orm_dir = tmp_path / "orm"
    config = tiny_llama(seed=1).config
    config.num_labels = 1
    orm = AutoModelForTokenClassification.from_config(config)
    torch.nn.init.constant_(orm.score.weight, 0.25)
    orm.save_pretrained(orm_dir)
    critic = ValueModel.from_backbone(orm_dir)
    assert bool((critic.net.score.weight == 0.25).all())


def test_save_and_load_round_trip_in_the_dtype_asked(policy_dir: Path, tmp_path: Path) -> None:
    critic = ValueModel.from_backbone(policy_dir, dtype="bfloat16")
    assert {p.dtype for p in critic.parameters()} == {torch.bfloat16}
    saved = critic.save(tmp_path / "critic")
    assert (saved / "model.safetensors").is_file()
    batch = build_policy_batch([[1, 2]], [[4, 5, 6]], pad_id=0)
    loaded = ValueModel.load(saved, dtype="bfloat16")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        assert torch.equal(loaded(batch), critic(batch))
        as_float = ValueModel.load(saved)(batch)
    assert {p.dtype for p in ValueModel.load(saved).parameters()} == {torch.float32}
    assert torch.allclose(as_float, critic(batch).detach(), atol=0.05)
    with pytest.raises(MissingPathError, match=r"critic\.json"):
        ValueModel.load(policy_dir)
