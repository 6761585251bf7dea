"""HF rollout engine: batched sampling with a KV cache, left padding and sampling log-probs.

Own decode loop over `model(...)` (not `model.generate`) so the log-probs are those of the
distribution actually sampled from and the randomness is row-addressable: one uniform per
(row, step) drawn from a per-call generator, so a row's sample does not depend on
which other rows share its batch (up to float round-off of padded matmuls).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.contracts.copies import first_copies
from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.progress import progress_bar
from grpo_core.contracts.rollout import FinishReason, RolloutBatch, SamplingParams
from grpo_core.engines.live_kv_cache import KV_BLOCK_TOKENS, preallocate_cache
from grpo_core.model.kv_cache import cache_keyword, returned_cache
from grpo_core.model.llama_decode import is_plain_llama, llama_decoder
from grpo_core.model.policy import encode_prompt, ensure_pad_token, load_weights_into

# Finished rows leave the decode batch (and its KV cache) once they are this share of it.
FINISHED_DROP_SHARE = 0.125


def stop_token_ids(
    tokenizer: PreTrainedTokenizerBase, generation_config: GenerationConfig | None
) -> list[int]:
    """Ids that end a completion: the tokenizer's EOS and the generation config's EOS id(s)."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(generation_config, "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def completion_texts(
    tokenizer: PreTrainedTokenizerBase,
    completion_ids: list[list[int]],
    finish_reasons: list[FinishReason],
    stop_ids: list[int],
) -> list[str]:
    """Decoded completions without special tokens and without the stop token that ended them."""
    stop = set(stop_ids)
    return [
        str(
            tokenizer.decode(
                c[:-1] if why == "stop" and c and c[-1] in stop else c, skip_special_tokens=True
            )
        )
        for c, why in zip(completion_ids, finish_reasons, strict=True)
    ]


def left_padded(prompts: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt ids (B, W) left-padded with `pad` to the longest, and their attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[r, width - len(p) :] = 1
    return ids, mask


def sample_tokens(
    logits: torch.Tensor, uniforms: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens (B,) and their log-probs under softmax(logits / T) (B,), by inverse CDF.

    logits (B, V) float32, uniforms (B,) in [0, 1). Greedy (argmax, log-prob of the T=1
    distribution) when temperature == 0; top-p keeps the smallest set of most likely tokens
    whose mass reaches top_p; the recorded log-prob is before top-p truncation.
    """
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, -1).gather(1, tokens[:, None])[:, 0]
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < params.top_p
        sorted_p = sorted_p * keep
    else:
        sorted_p, order = probs, None
    cdf = sorted_p.cumsum(-1)
    target = (uniforms * cdf[:, -1]).clamp(max=cdf[:, -1] * (1 - 1e-6))
    pick = torch.searchsorted(cdf, target[:, None], right=True).clamp(max=cdf.shape[1] - 1)
    tokens = (pick if order is None else order.gather(1, pick))[:, 0]
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


def row_uniforms(
    seed: int, steps: int, start: int, stop: int, chunk: int
) -> Iterator[torch.Tensor]:
    """Rows start..stop-1 of `torch.rand(rows, steps)` drawn from `seed`, `chunk` rows at a
    time: the CPU generator draws a tensor's values in order, so consecutive draws continue one
    draw (tests/grpo_core/engines/test_hf_rollout.py) and only a chunk of (rows, steps) is held
    at once, not every row's draws of a whole call (1000 prompts x 8 samples x 8k steps: 262 MB).
    """
    generator = torch.Generator().manual_seed(seed)
    for at in range(0, start, chunk):  # the rows before `start`: drawn and dropped
        torch.rand(min(chunk, start - at), steps, generator=generator)
    for at in range(start, stop, chunk):
        yield torch.rand(min(chunk, stop - at), steps, generator=generator)


@dataclass(frozen=True)
class Prefill:
    """A chunk's distinct prompts run once (left-padded): the forward's output (its KV cache
    and each prompt's last logits), the prompts' mask and positions, and the distinct prompt
    of each row of the chunk (groups[row])."""

    out: Any
    prompt_mask: torch.Tensor
    positions: torch.Tensor
    groups: list[int]
    distinct: int

    @property
    def width(self) -> int:
        return int(self.prompt_mask.shape[1])


def prefill(
    model: PreTrainedModel, prompts: list[list[int]], pad: int, device: torch.device
) -> Prefill:
    """Each distinct prompt of `prompts` through the model once, its KV cache kept: G samples
    of a prompt cost one prompt pass, not G."""
    firsts, groups = first_copies(tuple(p) for p in prompts)
    input_ids, prompt_mask = left_padded([tuple(prompts[i]) for i in firsts], pad)
    input_ids, prompt_mask = input_ids.to(device), prompt_mask.to(device)
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=prompt_mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
    )
    return Prefill(out, prompt_mask, positions, groups, len(firsts))


class HFRolloutEngine:
    """`RolloutEngine` over any HF causal LM (the model object it is given: the trainer's update
    in place reaches it); `batch_size` rows (prompt x sample) per forward."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 256,
        device: str | torch.device | None = None,
        show_progress: bool = True,
        progress_label: str = "sampling",
        lean_decode: bool = True,
    ) -> None:
        ensure_pad_token(tokenizer)
        self.model, self.tokenizer = model, tokenizer
        # decode steps of a plain Llama without HF's module stack (llama_decode.py)
        self.lean_decode = lean_decode
        self.batch_size = batch_size
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.show_progress = show_progress
        self.progress_label = progress_label  # the bar's title: the stage that samples
        self.stop_ids = stop_token_ids(tokenizer, getattr(model, "generation_config", None))

    def uses_lean_decode(self) -> bool:
        """Whether decode steps skip HF's module stack (llama_decode.py): a plain Llama."""
        return self.lean_decode and is_plain_llama(self.model)

    def load(self, checkpoint_dir: Path) -> None:
        """Sample the policy saved at `checkpoint_dir`: its weights copied into the model."""
        load_weights_into(self.model, checkpoint_dir)

    def receive_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Sample these weights: copied into the model, but for tensors that are the model's
        own (the trainer updated this very model in place: nothing to copy)."""
        own = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in weights.items():
                if own[name].data_ptr() != tensor.data_ptr():
                    own[name].copy_(tensor)

    def close(self) -> None:
        """Nothing to release: the model belongs to whoever built the engine."""

    def generate(
        self,
        prompts: list[str],
        n: int,
        params: SamplingParams,
        seed: int,
        *,
        rows: tuple[int, int] | None = None,
    ) -> RolloutBatch:
        """n samples per prompt, rows prompt-major; same inputs and seed give the same batch.

        rows=(start, stop): only rows start..stop-1 of that batch (a shard of it), sampled with
        the same draws: rows start..stop-1 of the call's (len(prompts) * n, max_new_tokens)
        uniforms (`row_uniforms`), so a row's randomness never depends on the split. With
        `start` a multiple of `batch_size` the chunks, hence padding and float results, equal
        the full call's.
        prompt_index stays global (row r -> prompt r // n).
        """
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1 (got {n})")
        total = len(prompts) * n
        start, stop = rows if rows is not None else (0, total)
        if not 0 <= start <= stop <= total:
            raise ValueError(f"rows must satisfy 0 <= start <= stop <= {total} (got {rows})")
        first = start // n  # only the prompts of the rows asked for are encoded
        encoded = [encode_prompt(self.tokenizer, p) for p in prompts[first : -(-stop // n)]]
        rows_ids = [encoded[r // n - first] for r in range(start, stop)]
        self._check_context(max(map(len, rows_ids), default=0), params.max_new_tokens)
        uniforms = row_uniforms(seed, params.max_new_tokens, start, stop, self.batch_size)
        out_ids: list[list[int]] = []
        out_logp: list[list[float]] = []
        reasons: list[FinishReason] = []
        was_training = self.model.training
        self.model.eval()
        bar = progress_bar(len(rows_ids), self.progress_label, "seq", enabled=self.show_progress)
        try:
            for at in range(0, len(rows_ids), self.batch_size):
                chunk = rows_ids[at : at + self.batch_size]
                ids, logp, lengths, stopped = self._generate_chunk(chunk, next(uniforms), params)
                for r, length in enumerate(lengths.tolist()):
                    out_ids.append(ids[r, :length].tolist())
                    out_logp.append(logp[r, :length].tolist())
                    reasons.append("stop" if stopped[r] else "length")
                bar.update(len(chunk))
        finally:
            bar.close()
            self.model.train(was_training)
        texts = completion_texts(self.tokenizer, out_ids, reasons, self.stop_ids)
        return RolloutBatch(
            prompt_index=[r // n for r in range(start, stop)],
            prompt_ids=[list(r) for r in rows_ids],
            completion_ids=out_ids,
            texts=texts,
            finish_reasons=reasons,
            logprobs=out_logp,
        )

    def _check_context(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """A SettingError when the longest prompt and its completion exceed the model's context
        (its config's max_position_embeddings): positions past it are not what it was trained
        on, or not there at all (learned position embeddings)."""
        config = getattr(getattr(self.model, "module", self.model), "config", None)
        context = getattr(config, "max_position_embeddings", None)
        if context is not None and prompt_tokens + max_new_tokens > context:
            raise SettingError(
                f"{self.progress_label}: a {prompt_tokens}-token prompt + max_new_tokens "
                f"{max_new_tokens} exceeds the policy's context (max_position_embeddings = "
                f"{context}): lower that stage's max_new_tokens, shorten the prompts, or use a "
                "policy with a longer context"
            )

    @torch.inference_mode()
    def _generate_chunk(
        self, prompts: list[list[int]], uniforms: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[bool]]:
        """Decode one left-padded chunk: ids (B, T), log-probs (B, T), lengths (B,), stopped.

        Each distinct prompt is prefilled once and its KV cache copied to its rows, so G
        samples of a prompt cost one prompt pass, not G.
        """
        dev, pad = self.device, self.tokenizer.pad_token_id
        first = prefill(self.model, prompts, pad, dev)
        out, prompt_mask, positions = first.out, first.prompt_mask, first.positions
        owner = torch.tensor(first.groups, device=dev)
        bsz, width, steps = len(prompts), first.width, params.max_new_tokens
        uniforms = uniforms.to(dev)
        past = returned_cache(out)
        cache_arg = cache_keyword(self.model)
        decoder = None
        if preallocate_cache(past, owner, width + steps, KV_BLOCK_TOKENS):
            decoder = llama_decoder(self.model, past.layers) if self.uses_lean_decode() else None
        elif first.distinct < bsz:
            past.reorder_cache(owner)
        logits = out.logits[owner, -1, :].float()
        # the attention mask of step t is the first width + t + 1 columns of this one
        mask = torch.cat(
            [prompt_mask[owner], torch.ones((bsz, steps), dtype=torch.long, device=dev)], dim=1
        )
        step_pos = positions[owner, -1:]
        stop_ids = torch.tensor(self.stop_ids, device=dev)
        tokens_out = torch.full((bsz, steps), pad, dtype=torch.long, device=dev)
        logp_out = torch.zeros((bsz, steps), dtype=torch.float32, device=dev)
        lengths = torch.full((bsz,), steps, dtype=torch.long, device=dev)
        finished = torch.zeros(bsz, dtype=torch.bool, device=dev)
        live = torch.arange(bsz, device=dev)  # chunk rows still in the decode batch, in order
        for t in range(steps):
            token, logp = sample_tokens(logits, uniforms[live, t], params)
            done = finished[live]  # rows that stopped earlier but are not dropped yet
            token = torch.where(done, torch.full_like(token, pad), token)
            tokens_out[live, t] = token
            logp_out[live, t] = torch.where(done, torch.zeros_like(logp), logp)
            hit_stop = torch.isin(token, stop_ids) & ~done
            lengths[live[hit_stop]] = t + 1
            finished[live[hit_stop]] = True
            done |= hit_stop
            if t == steps - 1 or bool(done.all()):
                break
            n_done = int(done.sum())
            # finished rows cost a full row of every later step: drop them from the batch
            # (and the cache) once they are a share of it and a few steps remain
            if n_done and n_done >= FINISHED_DROP_SHARE * len(live) and steps - t > 4:
                keep = (~done).nonzero()[:, 0]
                past.batch_select_indices(keep)
                live, token, logits = live[keep], token[keep], logits[keep]
                step_pos = step_pos[keep]
            step_pos = step_pos + 1
            step_mask = mask[live, : width + t + 1]
            if decoder is not None:
                logits = decoder.step(token, step_pos[:, 0], past.layers, step_mask).float()
            else:
                out = self.model(
                    input_ids=token[:, None],
                    attention_mask=step_mask,
                    position_ids=step_pos,
                    use_cache=True,
                    **{cache_arg: past},
                )
                past = returned_cache(out)
                logits = out.logits[:, -1, :].float()
        return tokens_out.cpu(), logp_out.cpu(), lengths.cpu(), finished.cpu().tolist()
