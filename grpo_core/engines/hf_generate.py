"""The `hf_generate` rollout engine: transformers' `generate` drives the decoding, for a model
whose forward pass the lean loop of hf_rollout.py cannot drive (it calls the forward itself,
with position ids, `logits_to_keep` and a cache it preallocates); a `generate`-only model
(remote code, a custom cache) still runs through this one.

What is sampled stays ours: a logits processor draws each row's token from the same uniform
(row, step) as the lean loop (`sample_tokens`), records its log-prob, and leaves `generate` a
one-hot to pick greedily. So both engines give the same tokens and log-probs for the same
seed (up to float round-off), row sharding stays exact, and no model generation-config
setting (top-k, repetition penalty, ...) changes the distribution the log-probs describe.
The price: every row is prefilled (no prompt cache shared by a group) and finished rows stay
in the batch, as `generate` does.

engines.hf.cache_implementation: static hands `generate` transformers' static cache, and
engines.hf.compile lets `generate` compile its forward over it (its own auto-compile, CUDA
graphs included; transformers compiles on GPUs only, so on CPU the run says so once and
decodes uncompiled). Continuous batching (`generate_batch`) is not used: it schedules rows
itself, so a logits processor cannot tell which row's uniform a score row takes.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from transformers import (
    CompileConfig,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine, left_padded, sample_tokens
from grpo_core.engines.static_decode import decode_compile_config, warn_once


class DrawnTokens(LogitsProcessor):
    """Step t of row r takes `sample_tokens(logits, uniforms[r, t])`: scores become that token's
    one-hot (0 there, -inf elsewhere) and its log-prob is kept in `logps`."""

    def __init__(self, uniforms: torch.Tensor, params: SamplingParams, prompt_width: int) -> None:
        self.uniforms, self.params, self.prompt_width = uniforms, params, prompt_width
        self.logps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.prompt_width
        token, logp = sample_tokens(scores.float(), self.uniforms[:, step], self.params)
        self.logps.append(logp)
        one_hot = torch.full_like(scores, float("-inf"))
        one_hot.scatter_(1, token[:, None], 0.0)
        return one_hot  # type: ignore[return-value]


def plain_generation_config(
    steps: int,
    stop_ids: list[int],
    pad_id: int,
    cache_implementation: str = "dynamic",
    compile_config: CompileConfig | None = None,
) -> GenerationConfig:
    """Greedy decoding of `steps` new tokens with nothing that alters the scores (the caller
    keeps the model's own generation config, with its penalties and suppressed tokens, out);
    a static cache compiled with `compile_config`, or never compiled without one."""
    return GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=steps,
        eos_token_id=stop_ids,
        pad_token_id=pad_id,
        use_cache=True,
        cache_implementation=None if cache_implementation == "dynamic" else cache_implementation,
        compile_config=compile_config,
        disable_compile=compile_config is None,
    )


class HFGenerateEngine(HFRolloutEngine):
    """`HFRolloutEngine` whose chunks are decoded by `model.generate` (module docstring);
    cache_implementation and compile: engines.hf's, as generate takes them."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 256,
        *,
        cache_implementation: Literal["dynamic", "static"] = "dynamic",
        compile: bool | CompileConfig = False,
        **options: Any,
    ) -> None:
        if compile is not False and cache_implementation != "static":
            raise ValueError(
                "compile needs cache_implementation = static: a compiled step needs fixed shapes"
            )
        super().__init__(model, tokenizer, batch_size, **options)
        self.cache_implementation, self.compile = cache_implementation, compile

    def uses_lean_decode(self) -> bool:
        return False  # generate runs the model's own forward

    def _compile_config(self) -> CompileConfig | None:
        """What generate compiles its forward with (None: uncompiled), said once on a device
        transformers does not compile on."""
        if self.compile is False:
            return None
        if self.device.type != "cuda":
            warn_once(
                f"engines.hf.compile does not apply to hf_generate on {self.device.type} "
                "(transformers compiles generate on GPUs only): decoding uncompiled"
            )
            return None
        if isinstance(self.compile, CompileConfig):
            return self.compile
        return decode_compile_config(self.device)

    @torch.inference_mode()
    def _generate_chunk(
        self, prompts: list[list[int]], uniforms: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[bool]]:
        dev, pad = self.device, self.tokenizer.pad_token_id
        input_ids, prompt_mask = left_padded(prompts, pad)
        bsz, width, steps = len(prompts), input_ids.shape[1], params.max_new_tokens
        drawn = DrawnTokens(uniforms.to(dev), params, width)
        model = getattr(self.model, "module", self.model)  # a DeepSpeed engine's model
        plain = plain_generation_config(
            steps, list(self.stop_ids), pad, self.cache_implementation, self._compile_config()
        )
        # generate fills every field left None from the model's own generation config
        # (suppressed tokens, bad words, ...): the model carries the plain one for this call
        own = model.generation_config
        model.generation_config = plain
        try:
            sequences = model.generate(  # type: ignore[operator]
                input_ids=input_ids.to(dev),
                attention_mask=prompt_mask.to(dev),
                generation_config=plain,
                logits_processor=LogitsProcessorList([drawn]),
            )
        finally:
            model.generation_config = own
        new = sequences[:, width:].cpu()
        taken = new.shape[1]  # generate stops early once every row has stopped
        tokens_out = torch.full((bsz, steps), pad, dtype=torch.long)
        logp_out = torch.zeros((bsz, steps), dtype=torch.float32)
        lengths = torch.full((bsz,), steps, dtype=torch.long)
        stopped = [False] * bsz
        logps = torch.stack(drawn.logps, dim=1).cpu()[:, :taken]
        stop_ids = torch.tensor(self.stop_ids)
        for row in range(bsz):
            hits = torch.isin(new[row], stop_ids).nonzero()
            if len(hits):
                lengths[row], stopped[row] = int(hits[0, 0]) + 1, True
            n = int(lengths[row])
            tokens_out[row, :n] = new[row, :n]
            logp_out[row, :n] = logps[row, :n]
        return tokens_out, logp_out, lengths, stopped
