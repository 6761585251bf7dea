"""Whether the engines a config selects can run here: each registered engine's own check
(grpo_core/engines/registry.py), run before any stage, with the field and the fix named."""

from __future__ import annotations

from flows.config import EnginesSection
from grpo_core.engines.registry import ROLLOUT_ENGINES, TRAIN_ENGINES


def check_engines(engines: EnginesSection) -> None:
    """Fail before any stage runs when a selected engine is not installed here."""
    TRAIN_ENGINES[engines.train].requires(engines.settings_of(engines.train))
    ROLLOUT_ENGINES[engines.rollout].requires(engines.settings_of(engines.rollout))
