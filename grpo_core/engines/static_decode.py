"""The `hf` engine's decode loop over transformers' static KV cache, optionally compiled
(engines.hf.cache_implementation: static, engines.hf.compile: true).

The dynamic loop (hf_rollout.py) changes shapes at every step: the cache grows by a token and
finished rows leave the batch. That suits eager PyTorch but rules out a compiled step whose
kernels are captured once (CUDA graphs, `torch.compile(mode="reduce-overhead")`), where a
decode step of a small model on a GPU spends most of its time launching kernels. Here every
step of a chunk has the same shapes: a `StaticCache` of rows x capacity tokens (transformers'
own, the cache `generate(cache_implementation="static")` uses), the attention mask over the
whole capacity (the causal mask hides what is not written yet), finished rows kept in the
batch and fed padding. The step is the model's own forward, compiled through
`model.get_compiled_call` as `generate` compiles it. Prefill, sampling and the recorded
log-probs are the dynamic loop's: each distinct prompt prefilled once (uncompiled, its cache
copied to its rows), then `sample_tokens` on the same per-(row, step) uniforms, so greedy tokens
are the same and log-probs equal a forward pass up to float round-off.

Shapes are rounded so a run compiles few graphs: rows to the next power of two (at most the
engine's batch size; the padding rows copy row 0 and are dropped), capacity to a multiple of
CAPACITY_BLOCK tokens. Each row count keeps its cache for the engine's life, so CUDA graphs
replay on the same buffers call after call; the price is that memory, rows x capacity x the
model's KV bytes per token, held while the engine lives (the GRPO update included).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from transformers import CompileConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache, DynamicLayer, StaticCache, StaticLayer

from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine, prefill, sample_tokens
from grpo_core.model.kv_cache import cache_keyword, returned_cache

log = logging.getLogger(__name__)

_SAID: set[str] = set()


def warn_once(message: str) -> None:
    """Log a setting that cannot apply, once per process (every engine of a run shares it)."""
    if message not in _SAID:
        _SAID.add(message)
        log.warning("%s", message)


# dynamo compiles each (rows, capacity) shape as its own graph, and falls back to eager past
# its recompile limit (8 by default); a run's stages reach a dozen shapes or so.
COMPILED_SHAPES = 64

# Static caches hold a multiple of this many tokens: prompts of nearby widths share a graph.
CAPACITY_BLOCK = 256


def rows_bucket(rows: int, batch_size: int) -> int:
    """Rows of the static cache a chunk of `rows` decodes in: the next power of two, capped at
    the engine's batch size (never below `rows`)."""
    return max(rows, min(batch_size, 1 << (rows - 1).bit_length()))


def capacity_bucket(tokens: int) -> int:
    """Cache positions for `tokens` (prompt width + new tokens), rounded up to CAPACITY_BLOCK."""
    return -(-tokens // CAPACITY_BLOCK) * CAPACITY_BLOCK


def why_no_static_cache(model: torch.nn.Module) -> str | None:
    """Why the static decode loop cannot drive `model` (None: it can): it needs a transformers
    model whose every layer attends over the whole cache (no sliding window or linear layers)."""
    if not isinstance(model, PreTrainedModel):
        return f"{type(model).__name__} is not a transformers model (a wrapper around one)"
    layers = StaticCache(config=model.config, max_cache_len=CAPACITY_BLOCK).layers
    if not layers or any(type(layer) is not StaticLayer for layer in layers):
        return f"{model.config.model_type}'s cache has layers other than full attention"
    return None


def decode_compile_config(device: torch.device) -> CompileConfig:
    """How the step is compiled: inductor with CUDA graphs on CUDA ("reduce-overhead",
    transformers' default for generate), inductor alone elsewhere; shapes static."""
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    return CompileConfig(fullgraph=False, dynamic=False, mode=mode)


class StaticCacheRolloutEngine(HFRolloutEngine):
    """`HFRolloutEngine` whose chunks decode over static caches kept per row count (module
    docstring); compile: compile the step (True: decode_compile_config, or these options).
    A model the static cache cannot hold decodes with the dynamic loop, said once in the log."""

    cache_implementation = "static"

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 256,
        *,
        compile: bool | CompileConfig = False,
        **options: Any,
    ) -> None:
        super().__init__(model, tokenizer, batch_size, **options)
        self.compile = compile
        self.compile_config = compile if isinstance(compile, CompileConfig) else None
        if compile is True:
            self.compile_config = decode_compile_config(self.device)
        self.cannot_hold = why_no_static_cache(model)
        if self.compile_config is not None and self.cannot_hold is None:
            # process-wide, as the compiled forward it concerns
            dynamo = torch._dynamo.config
            dynamo.recompile_limit = max(dynamo.recompile_limit, COMPILED_SHAPES)
        self.cache_arg = cache_keyword(model)
        self._caches: dict[int, tuple[int, StaticCache]] = {}  # rows -> (capacity, cache)

    def uses_lean_decode(self) -> bool:
        return self.cannot_hold is not None and super().uses_lean_decode()

    def close(self) -> None:
        """Free the kept caches (the model still belongs to whoever built the engine)."""
        self._caches.clear()

    def _cache(
        self, prefilled: DynamicCache, rows: torch.Tensor, tokens: int
    ) -> tuple[StaticCache, int]:
        """The kept cache of len(rows) rows and at least `tokens` positions (a new one when none
        is kept or the kept one is too short) and its capacity, holding prefill row rows[i] as
        row i."""
        capacity, cache = self._caches.get(len(rows), (0, None))
        if cache is None or capacity < tokens:
            capacity = capacity_bucket(tokens)
            cache = StaticCache(config=self.model.config, max_cache_len=capacity)
            self._caches[len(rows)] = capacity, cache
        else:
            cache.reset()
        for layer, filled in zip(cache.layers, prefilled.layers, strict=True):
            # why_no_static_cache and _generate_chunk checked both kinds
            assert isinstance(layer, StaticLayer) and isinstance(filled, DynamicLayer)
            keys, values = filled.keys, filled.values
            assert keys is not None and values is not None
            layer.update(keys[rows], values[rows])
        return cache, capacity

    def _step(
        self, cache: StaticCache, token: torch.Tensor, position: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Logits (R, V) float32 after `token` (R,) at `position` (R, 1) over the cache."""
        forward: Callable[..., Any] = self.model
        if self.compile_config is not None:
            forward = self.model.get_compiled_call(self.compile_config)
            if self.device.type == "cuda":  # the last step's outputs are consumed: reuse them
                torch.compiler.cudagraph_mark_step_begin()
        out = forward(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=position,
            use_cache=True,
            **{self.cache_arg: cache},
        )
        return out.logits[:, -1, :].float()

    @torch.inference_mode()
    def _generate_chunk(
        self, prompts: list[list[int]], uniforms: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[bool]]:
        if self.cannot_hold is not None:
            uncompiled = ", uncompiled" if self.compile_config is not None else ""
            warn_once(
                "engines.hf.cache_implementation = static does not apply here "
                f"({self.cannot_hold}): decoding with the dynamic cache{uncompiled}"
            )
            return super()._generate_chunk(prompts, uniforms, params)
        dev, bsz, steps = self.device, len(prompts), params.max_new_tokens
        pad = self.tokenizer.pad_token_id
        first = prefill(self.model, prompts, pad, dev)
        prefilled = returned_cache(first.out)
        if not isinstance(prefilled, DynamicCache) or any(
            type(layer) is not DynamicLayer for layer in prefilled.layers
        ):
            raise RuntimeError(f"prefill returned {type(prefilled).__name__}, not a DynamicCache")
        rows = rows_bucket(bsz, self.batch_size)
        owner = torch.tensor(first.groups + [first.groups[0]] * (rows - bsz), device=dev)
        cache, capacity = self._cache(prefilled, owner, first.width + steps)
        mask = torch.ones((rows, capacity), dtype=torch.long, device=dev)
        mask[:, : first.width] = first.prompt_mask[owner]
        position = first.positions[owner, -1:]
        logits = first.out.logits[owner, -1, :].float()
        uniforms = torch.cat([uniforms.to(dev), uniforms.new_zeros((rows - bsz, steps))])
        stop = torch.tensor(self.stop_ids, device=dev)
        tokens_out = torch.full((rows, steps), pad, dtype=torch.long, device=dev)
        logp_out = torch.zeros((rows, steps), dtype=torch.float32, device=dev)
        lengths = torch.full((rows,), steps, dtype=torch.long, device=dev)
        stopped = torch.zeros(rows, dtype=torch.bool, device=dev)
        done = torch.arange(rows, device=dev) >= bsz  # padding rows: decoded, never recorded
        for t in range(steps):
            token, logp = sample_tokens(logits, uniforms[:, t], params)
            token = torch.where(done, torch.full_like(token, pad), token)
            tokens_out[:, t] = token
            logp_out[:, t] = torch.where(done, torch.zeros_like(logp), logp)
            hit_stop = torch.isin(token, stop) & ~done
            lengths[hit_stop] = t + 1
            stopped |= hit_stop
            done |= hit_stop
            if t == steps - 1 or bool(done.all()):
                break
            position = position + 1
            logits = self._step(cache, token, position, mask)
        return (
            tokens_out[:bsz].cpu(),
            logp_out[:bsz].cpu(),
            lengths[:bsz].cpu(),
            stopped[:bsz].cpu().tolist(),
        )
