"""Padded policy batches give the log-probs of unpadded forward passes (left and right)."""

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM

from grpo_core.contracts.policy_batch import PaddingSide, build_policy_batch
from grpo_core.model import forward
from grpo_core.model.forward import length_buckets, sequence_logprobs, sequence_logprobs_and_entropy
from tests.models import tiny_llama as shared_tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


VOCAB = 20
PAD = 0


def tiny_llama(attn: str = "sdpa", layers: int = 2) -> LlamaForCausalLM:
    model = shared_tiny_llama(
        vocab=VOCAB, layers=layers, heads=4, positions=128, pad_token_id=PAD, attn=attn
    )
    return model.eval()


def tiny_gpt2() -> GPT2LMHeadModel:
    """Absolute position embeddings: wrong position ids would show (RoPE hides shifts)."""
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=16, n_layer=2, n_head=2)
    return GPT2LMHeadModel(cfg).eval()


def random_rows(
    rows: int, max_prompt: int, max_completion: int, seed: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Rows of very different lengths; completions may contain the pad id (pad == EOS)."""
    gen = torch.Generator().manual_seed(seed)

    def ids(low: int, length: int) -> list[int]:
        return torch.randint(low, VOCAB, (length,), generator=gen).tolist()

    prompts = [
        ids(1, int(torch.randint(1, max_prompt + 1, (1,), generator=gen))) for _ in range(rows)
    ]
    completions = [
        ids(0, int(torch.randint(0, max_completion + 1, (1,), generator=gen))) for _ in range(rows)
    ]
    return prompts, completions


def unpadded_logprobs(
    model: torch.nn.Module, prompts: list[list[int]], completions: list[list[int]]
) -> list[torch.Tensor]:
    """Reference: one forward pass per row, no padding, default positions."""
    out = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, completions, strict=True):
            ids = torch.tensor([prompt + completion])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            picked = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
            out.append(picked[len(prompt) - 1 :])
    return out


def max_gap(
    model: torch.nn.Module,
    prompts: list[list[int]],
    completions: list[list[int]],
    side: PaddingSide,
    micro_batch_size: int | None = None,
) -> float:
    batch = build_policy_batch(prompts, completions, PAD, side)
    with torch.no_grad():
        packed = batch.full_to_response(sequence_logprobs(model, batch, 1.0, micro_batch_size))
    reference = unpadded_logprobs(model, prompts, completions)
    gaps = [
        float((packed[i, : len(ref)] - ref).abs().max())
        for i, ref in enumerate(reference)
        if len(ref)
    ]
    return max(gaps)


def test_layout_right_and_left() -> None:
    right = build_policy_batch([[5, 6], [7]], [[8], [9, 0, 4]], pad_id=0, padding_side="right")
    assert right.input_ids.tolist() == [[5, 6, 8, 0], [7, 9, 0, 4]]
    assert right.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert right.position_ids.tolist() == [[0, 1, 2, 2], [0, 1, 2, 3]]
    assert right.response_mask.tolist() == [[0, 0, 1, 0], [0, 1, 1, 1]]
    left = build_policy_batch([[5, 6], [7]], [[8], [9, 0, 4]], pad_id=0, padding_side="left")
    assert left.input_ids.tolist() == [[0, 5, 6, 8], [7, 9, 0, 4]]
    assert left.attention_mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert left.position_ids.tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]
    assert left.response_mask.tolist() == [[0, 0, 0, 1], [0, 1, 1, 1]]
    assert left.response_lengths.tolist() == [1, 3]


def test_empty_prompt_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        build_policy_batch([[]], [[1]], pad_id=0)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padded_equals_unpadded(side: PaddingSide, attn: str) -> None:
    prompts, completions = random_rows(12, 8, 15, seed=1)
    assert max_gap(tiny_llama(attn), prompts, completions, side) < 1e-5


@pytest.mark.parametrize("side", ["left", "right"])
def test_absolute_position_model_padded_equals_unpadded(side: PaddingSide) -> None:
    prompts, completions = random_rows(12, 8, 15, seed=2)
    assert max_gap(tiny_gpt2(), prompts, completions, side) < 1e-5


@pytest.mark.parametrize("side", ["left", "right"])
def test_large_batch_of_very_different_lengths(side: PaddingSide) -> None:
    # the demo notes saw a 4.8-nat gap on one row of a 512-row batch; rows here run from
    # 1 to 60 tokens and completions contain the pad id, which a mask built from
    # `ids != pad_id` would drop
    prompts, completions = random_rows(264, 12, 48, seed=3)
    assert sum(PAD in c for c in completions) > 100
    assert max_gap(tiny_llama(layers=1), prompts, completions, side, micro_batch_size=64) < 1e-5


def test_micro_batching_does_not_change_logprobs() -> None:
    prompts, completions = random_rows(10, 5, 9, seed=4)
    batch = build_policy_batch(prompts, completions, PAD, "left")
    model = tiny_llama()
    with torch.no_grad():
        whole, entropy = sequence_logprobs_and_entropy(model, batch)
        parts = sequence_logprobs(model, batch, micro_batch_size=3)
    assert torch.allclose(whole, parts, atol=1e-6)
    assert torch.all(whole[batch.response_mask == 0] == 0)
    assert torch.all(entropy[batch.response_mask == 0] == 0)
    assert torch.all(entropy[batch.response_mask > 0] > 0)


def test_temperature_scales_logits() -> None:
    prompts, completions = random_rows(3, 4, 5, seed=5)
    batch = build_policy_batch(prompts, completions, PAD)
    model = tiny_llama()
    with torch.no_grad():
        hot = sequence_logprobs(model, batch, temperature=2.0)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1] / 2.0, -1).gather(-1, batch.input_ids[:, 1:, None])
    expected = torch.nn.functional.pad(logp.squeeze(-1), (1, 0)) * batch.response_mask
    assert torch.allclose(hot, expected, atol=1e-5)


def test_response_coordinates_round_trip() -> None:
    batch = build_policy_batch([[5, 6], [7]], [[8], [9, 1, 4]], pad_id=0, padding_side="left")
    packed = torch.tensor([[0.5, 0.0, 0.0], [1.0, 2.0, 3.0]])
    full = batch.response_to_full(packed)
    assert full.tolist() == [[0, 0, 0, 0.5], [0, 1.0, 2.0, 3.0]]
    assert torch.equal(batch.full_to_response(full), packed)
    assert torch.equal(batch.lists_to_full([[0.5], [1.0, 2.0, 3.0]]), full)
    assert batch.expand_per_sequence(torch.tensor([2.0, -1.0])).tolist() == [
        [0, 0, 0, 2.0],
        [0, -1.0, -1.0, -1.0],
    ]
    with pytest.raises(ValueError, match="one value per completion token"):
        batch.lists_to_full([[0.5], [1.0]])


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("make_model", [tiny_llama, tiny_gpt2])
def test_grouped_rows_share_the_prompt_pass_with_same_values_and_gradients(
    side: PaddingSide, make_model: Callable[[], torch.nn.Module]
) -> None:
    # G = 4 completions per prompt, as GRPO batches are: the prompt is run once per group
    prompts, completions = random_rows(3, 7, 9, seed=6)
    _, extra = random_rows(9, 1, 9, seed=7)
    grouped_prompts = [p for p in prompts for _ in range(4)]
    grouped_completions = [c for i, c in enumerate(completions) for c in [c, *extra[3 * i :][:3]]]
    model = make_model()
    assert max_gap(model, grouped_prompts, grouped_completions, side) < 1e-5

    def grads(rows: list[int]) -> list[torch.Tensor]:
        model.zero_grad()
        total = torch.zeros(())
        for r in rows:  # one row per batch: nothing is shared
            one = build_policy_batch([grouped_prompts[r]], [grouped_completions[r]], PAD, side)
            total = total + sequence_logprobs(model, one).sum()
        batch = build_policy_batch(grouped_prompts, grouped_completions, PAD, side)
        if rows:
            total.backward()
        else:
            sequence_logprobs(model, batch).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    separate, shared = grads(list(range(12))), grads([])
    assert len(separate) == len(shared)
    for a, b in zip(separate, shared, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_length_buckets_partition_rows_at_least_cost() -> None:
    def cost(parts: list[list[int]], per_group: int) -> int:
        return sum(len(g) * max(g) + per_group for g in parts)

    gen = torch.Generator().manual_seed(0)
    for trial in range(30):
        lengths = torch.randint(
            0, 12, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen
        )
        per_group = [0, 5, 20, 1000][trial % 4]
        groups = length_buckets(lengths, per_group)
        assert sorted(torch.cat(groups).tolist()) == list(range(len(lengths)))

        # brute force: every way to cut the sorted lengths into consecutive groups
        ordered = sorted(lengths.tolist(), reverse=True)
        best = min(
            cost([ordered[a:b] for a, b in itertools.pairwise([0, *cuts, len(ordered)])], per_group)
            for k in range(len(ordered))
            for cuts in itertools.combinations(range(1, len(ordered)), k)
        )
        assert cost([lengths[g].tolist() for g in groups], per_group) == best
    assert len(length_buckets(torch.tensor([30, 30, 2, 2]), 1000)) == 1
    assert len(length_buckets(torch.tensor([30, 30, 2, 2]), 0)) == 2


@pytest.mark.parametrize("min_saving", [0, 10_000])
@pytest.mark.parametrize("make_model", [tiny_llama, tiny_gpt2])
def test_length_buckets_give_the_values_entropies_and_gradients_of_separate_rows(
    min_saving: int, make_model: Callable[[], torch.nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared prompts with completions of very different lengths (empty, one token, long),
    run in several length buckets (min_saving 0) or one: each row as if run alone."""
    monkeypatch.setattr(forward, "BUCKET_MIN_SAVING", min_saving)
    prompts, _ = random_rows(4, 9, 1, seed=8)
    _, completions = random_rows(16, 1, 14, seed=9)
    completions[0], completions[5], completions[6] = [], [3], [4] * 14
    grouped_prompts = [p for p in prompts for _ in range(4)]
    lengths = torch.tensor([len(c) for c in completions])
    assert len(length_buckets(lengths)) == (1 if min_saving else len(set(lengths.tolist())))
    model = make_model()
    batch = build_policy_batch(grouped_prompts, completions, PAD, "right")

    def run(rows: list[int] | None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        if rows is None:
            logp, entropy = sequence_logprobs_and_entropy(model, batch)
        else:  # one row per batch: nothing shared, no buckets
            parts = [
                sequence_logprobs_and_entropy(
                    model, build_policy_batch([grouped_prompts[r]], [completions[r]], PAD)
                )
                for r in rows
            ]
            width = batch.input_ids.shape[1]
            logp = torch.cat(
                [torch.nn.functional.pad(lp, (0, width - lp.shape[1])) for lp, _ in parts]
            )
            entropy = torch.cat(
                [torch.nn.functional.pad(e, (0, width - e.shape[1])) for _, e in parts]
            )
        (logp * torch.linspace(0.5, 1.5, logp.numel()).reshape(logp.shape)).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return logp.detach(), entropy, grads

    shared, separate = run(None), run(list(range(16)))
    assert torch.allclose(shared[0], separate[0], atol=1e-5)
    assert torch.allclose(shared[1], separate[1], atol=1e-5)
    assert len(shared[2]) == len(separate[2])
    for a, b in zip(shared[2], separate[2], strict=True):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("with_old_logprobs", [True, False])
def test_update_tensors_round_trip_through_a_file(tmp_path: Path, with_old_logprobs: bool) -> None:
    """What the DeepSpeed launcher's ranks read from batch.safetensors (and Ray's ranks from
    the object store) is the batch, advantages and old log-probs the stage handed over."""
    from safetensors.torch import load_file, save_file

    from grpo_core.contracts.policy_batch import update_inputs, update_tensors

    batch = build_policy_batch([[3, 4], [5]], [[6, 7, 8], [9]], pad_id=PAD, padding_side="left")
    advantages = torch.tensor([0.5, -0.5])
    old = torch.randn(batch.response_mask.shape) if with_old_logprobs else None
    tensors = update_tensors(batch, advantages.requires_grad_(), old)
    assert all(t.device.type == "cpu" and t.is_contiguous() for t in tensors.values())
    assert not any(t.requires_grad for t in tensors.values())
    save_file(tensors, tmp_path / "batch.safetensors")
    read, read_advantages, read_old = update_inputs(
        load_file(tmp_path / "batch.safetensors"), "cpu"
    )
    for field in ("input_ids", "attention_mask", "position_ids", "response_mask"):
        assert torch.equal(getattr(read, field), getattr(batch, field))
    assert torch.equal(read_advantages, advantages.detach())
    assert (read_old is None) == (old is None)
    if old is not None:
        assert torch.equal(read_old, old)
