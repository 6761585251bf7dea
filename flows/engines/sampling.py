"""The rollout engines of one run (`engines.rollout`, grpo_core/engines/registry.py). An engine
that keeps a process (the vLLM worker: seconds to start) is started at the first stage that
samples with it and reused by every later stage, which gives it its policy with `load`; the
run closes it at its end. Other engines are built for each stage on the stage's model."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.engines import vllm_actors  # noqa: F401  (registers engines.vllm.placement = ray)
from flows.engines.ray_runtime import start_ray
from flows.engines_config import EnginesSection
from grpo_core.contracts.numerics import DIVERGED, require_finite
from grpo_core.contracts.rollout import RolloutBatch, RolloutEngine, Sampler, SamplingParams
from grpo_core.engines.registry import ROLLOUT_ENGINES, RolloutRequest

log = logging.getLogger("itergrpo")

Purpose = Literal["rollout", "label", "evaluate", "grpo"]


class RolloutEngines:
    """Builds the rollout engine a stage asks for, keeping at most one process-keeping engine
    (a second one, e.g. with other vLLM options, replaces it: GPU memory holds one)."""

    def __init__(
        self,
        section: EnginesSection,
        *,
        policy_dtype: str,
        seed: int,
        attn_implementation: str | None = None,
        log_dir: Path,
        scratch_dir: Path,
        ray_address: str | None = None,
    ) -> None:
        """ray_address: cluster.ray_address, where engines placed on Ray actors start (joined
        before they start, so they do not start a local Ray)."""
        self.section, self.policy_dtype, self.seed = section, policy_dtype, seed
        self.attn_implementation = attn_implementation  # policy.attn_implementation
        self.log_dir, self.scratch_dir = log_dir, scratch_dir
        self.ray_address = ray_address
        self._kept: RolloutEngine | None = None
        self._kept_key: tuple[str, bool] | None = None

    def engine(
        self,
        name: str,
        purpose: Purpose,
        checkpoint_dir: Path,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        show_progress: bool = True,
    ) -> RolloutEngine:
        """Engine `name` sampling the policy at checkpoint_dir (`model`: the same in memory).
        Labelling always caches prefixes (each step prefix is shared by N completions)."""
        spec = ROLLOUT_ENGINES[name]
        settings = self.section.settings_of(name)
        capabilities = spec.capabilities(settings)
        caching = purpose == "label" or capabilities.prefix_caching
        request = RolloutRequest(
            checkpoint_dir=checkpoint_dir,
            tokenizer=tokenizer,
            model=model,
            batch_size=batch_size,
            purpose=purpose,
            dtype=self.policy_dtype,
            attn_implementation=self.attn_implementation,
            prefix_caching=caching,
            seed=self.seed,
            log_dir=self.log_dir,
            scratch_dir=self.scratch_dir,
            show_progress=show_progress,
        )
        if not capabilities.keeps_process:
            return spec.build(request, settings)
        key = (name, caching)
        if self._kept is not None and self._kept_key != key:
            self.close()
        if self._kept is None:
            log.info("starting the %s rollout engine on %s", name, checkpoint_dir)
            if self.ray_address is not None and capabilities.placed_on_ray:
                start_ray(self.ray_address, 0, f"{name} engines")
            self._kept, self._kept_key = spec.build(request, settings), key
        else:
            self._kept.load(checkpoint_dir)
        return self._kept

    def close(self) -> None:
        """Stop the kept engine's process, if one runs."""
        if self._kept is not None:
            self._kept.close()
        self._kept = self._kept_key = None


@runtime_checkable
class SleepingEngine(Protocol):
    """A rollout engine that can free its device memory until its next request."""

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch: ...

    def sleep(self) -> None: ...


class SleepsAfterSampling:
    """A GRPO step's sampler whose engine sleeps once the step's outputs are sampled (one that
    declares sleeps_while_training: engines.vllm.sleep_while_training): the update that
    follows on the same GPU gets the engine's memory, and the engine's next request (the new
    weights) wakes it."""

    def __init__(self, engine: SleepingEngine) -> None:
        self.engine = engine

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        batch = self.engine.generate(prompts, n, params, seed=seed)
        self.engine.sleep()
        return batch


class FiniteSampler:
    """A stage's sampler whose every batch has finite log-probs, checked before the stage can
    store anything derived from it: a policy whose weights went non-finite (diverged, or a
    damaged checkpoint) samples garbage with NaN log-probs, and its labels, reward models and
    evaluation must not be committed (the GRPO step checks its own samples the same way)."""

    def __init__(self, inner: Sampler, where: str) -> None:
        self.inner, self.where = inner, where

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        batch = self.inner.generate(prompts, n, params, seed=seed)
        sampled = [lp for row in batch.logprobs for lp in row]
        require_finite("the policy's sampling log-probs", sampled, where=self.where, cause=DIVERGED)
        return batch
