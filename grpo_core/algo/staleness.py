"""Staleness of asynchronous GRPO's batches as pure functions: which policy version samples a
step's batch, whether a batch is inside the bound, and the per-step figures stored
(docs/algorithm.md section 15).

Policy version v is the policy after v steps of the stage (version 0: policy_k); the batch of
step s trained on version s has staleness s - v.
"""

from __future__ import annotations

from grpo_core.algo.staleness_config import AsyncSettings

# Per-step metric names (stored only when grpo.async.max_staleness > 0).
POLICY_VERSION = "async_policy_version"
STALENESS = "async_staleness"
DROPPED = "async_dropped"


def sampling_version(step: int, max_staleness: int, first_version: int = 0) -> int:
    """The version that samples step `step`'s batch under on_stale wait: max(0, step - k),
    raised to `first_version`, the oldest one the sampler can be given (a resumed stage's
    first step: the older versions were never stored)."""
    return max(first_version, step - max_staleness)


def staleness(step: int, version: int) -> int:
    """How many updates the batch of `step`, sampled by `version`, lags behind the policy it
    trains (version `step`)."""
    if version > step:
        raise ValueError(f"a batch of step {step} sampled by a later policy version {version}")
    return step - version


def within_bound(step: int, version: int, max_staleness: int) -> bool:
    """Whether the batch of `step` sampled by `version` may be trained on."""
    return staleness(step, version) <= max_staleness


def may_sample(
    step: int, taken: int, newest: int, settings: AsyncSettings, first_version: int = 0
) -> bool:
    """Whether the sampler may start step `step`'s batch now, the trainer having taken the
    batches of the steps before `taken` and handed on versions up to `newest`. wait: once the
    version sampling_version names is there; drop: at most max_staleness batches beyond the
    one the trainer takes next, on whatever version it has (a resumed stage's: from its first
    version on)."""
    k = settings.max_staleness
    if settings.on_stale == "wait":
        return sampling_version(step, k, first_version) <= newest
    return first_version <= newest and step <= taken + k


def staleness_stats(step: int, version: int, dropped: int) -> dict[str, float]:
    """The figures a step stores: the version that sampled the batch it trained on, that
    batch's staleness, and how many batches of the step were dropped as too old."""
    return {
        POLICY_VERSION: float(version),
        STALENESS: float(staleness(step, version)),
        DROPPED: float(dropped),
    }
