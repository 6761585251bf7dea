"""A rollout engine's capabilities are read from its registration, never from its settings by
attribute name: toy engines registered with capabilities are the GRPO stage's engine, kept for
the run, asked to cache prefixes, started on Ray and given the stage's model as they declare
(docs/extending.md, "A rollout engine")."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flows.config import GRPOStageSection
from flows.engines import sampling
from flows.engines.policy_updaters import stage_holds_policy_weights
from flows.engines.sampling import RolloutEngines
from flows.engines_config import EnginesSection
from grpo_core.engines import static_decode, vllm_rollout
from grpo_core.engines.config import VLLMSettings
from grpo_core.engines.registry import (
    ROLLOUT_ENGINES,
    RolloutCapabilities,
    RolloutEngineSpec,
    RolloutRequest,
)
from grpo_core.model.policy import build_char_tokenizer

BUILT: list[RolloutRequest] = []


class ToyEngine:
    """Records the request it was built for and the checkpoints it loads; samples nothing."""

    def __init__(self, request: RolloutRequest, settings: None) -> None:
        BUILT.append(request)
        self.loaded: list[Path] = []

    def load(self, checkpoint_dir: Path) -> None:
        self.loaded.append(checkpoint_dir)

    def close(self) -> None:
        pass


Register = Callable[[str, RolloutCapabilities], str]


@pytest.fixture
def register() -> Iterator[Register]:
    """Registers toy engines declaring the capabilities given; unregistered after the test."""
    names: list[str] = []

    def add(name: str, capabilities: RolloutCapabilities) -> str:
        spec = RolloutEngineSpec(
            name, "test: a toy", ToyEngine, capabilities=lambda settings: capabilities
        )
        ROLLOUT_ENGINES.add(name, spec)
        names.append(name)
        return name

    BUILT.clear()
    yield add
    for name in names:
        ROLLOUT_ENGINES.remove(name)


def test_the_grpo_stage_samples_with_the_engine_that_declares_it_samples_inside_grpo(
    register: Register,
) -> None:
    inside = register("toy_inside", RolloutCapabilities(samples_in_grpo=True))
    outside = register("toy_outside", RolloutCapabilities(samples_in_grpo=False))
    assert EnginesSection(rollout=inside).grpo_rollout == inside
    assert EnginesSection(rollout=outside).grpo_rollout == "hf"
    vllm_out = EnginesSection.model_validate({"rollout": "vllm", "vllm": {"in_grpo": False}})
    assert EnginesSection(rollout="vllm").grpo_rollout == "vllm"
    assert vllm_out.grpo_rollout == "hf"


def _engines(name: str, tmp_path: Path) -> RolloutEngines:
    return RolloutEngines(
        EnginesSection(rollout=name),
        policy_dtype="float32",
        seed=0,
        log_dir=tmp_path / "logs",
        scratch_dir=tmp_path / "scratch",
        ray_address="auto",
    )


def test_an_engine_that_keeps_its_process_is_built_once_with_its_caching_and_its_ray(
    register: Register, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kept = RolloutCapabilities(keeps_process=True, prefix_caching=False, placed_on_ray=True)
    name = register("toy_kept", kept)
    started: list[tuple[str | None, str]] = []

    def start_ray(address: str | None, cpus: float, who: str) -> tuple[Any, bool]:
        started.append((address, who))
        return None, False

    monkeypatch.setattr(sampling, "start_ray", start_ray)
    engines, tokenizer = _engines(name, tmp_path), build_char_tokenizer()
    first = engines.engine(name, "rollout", tmp_path / "p0", None, tokenizer, 4)
    again = engines.engine(name, "evaluate", tmp_path / "p1", None, tokenizer, 4)
    assert again is first and isinstance(first, ToyEngine)
    assert first.loaded == [tmp_path / "p1"]
    assert [request.prefix_caching for request in BUILT] == [False]
    labeller = engines.engine(name, "label", tmp_path / "p1", None, tokenizer, 4)
    assert labeller is not first and BUILT[-1].prefix_caching  # labelling always caches
    assert started == [("auto", "toy_kept engines")] * 2
    engines.close()


def test_an_engine_without_a_process_is_built_per_stage_and_never_starts_ray(
    register: Register, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = register("toy_plain", RolloutCapabilities(placed_on_ray=True))
    monkeypatch.setattr(sampling, "start_ray", pytest.fail)
    engines, tokenizer = _engines(name, tmp_path), build_char_tokenizer()
    first = engines.engine(name, "rollout", tmp_path / "p0", None, tokenizer, 4)
    second = engines.engine(name, "rollout", tmp_path / "p0", None, tokenizer, 4)
    assert first is not second and len(BUILT) == 2 and BUILT[0].prefix_caching


def test_with_ray_ranks_the_stage_holds_the_policy_for_an_engine_that_shares_it(
    register: Register,
) -> None:
    shares = register("toy_shares", RolloutCapabilities(shares_model=True))
    own = register("toy_own", RolloutCapabilities())
    grpo = GRPOStageSection()
    holds = {
        name: stage_holds_policy_weights(EnginesSection(rollout=name, train_workers="ray"), grpo)
        for name in (shares, own)
    }
    assert holds == {shares: True, own: False}


def test_vllm_declares_its_capabilities_from_its_settings() -> None:
    declared = ROLLOUT_ENGINES["vllm"].capabilities
    assert declared(VLLMSettings()) == RolloutCapabilities(keeps_process=True)
    settings = VLLMSettings(
        in_grpo=False,
        sleep_while_training=True,
        placement="ray",
        prefix_caching=False,
        weight_sync="disk",
    )
    assert declared(settings) == RolloutCapabilities(
        keeps_process=True,
        samples_in_grpo=False,
        sleeps_while_training=True,
        placed_on_ray=True,
        prefix_caching=False,
        reloads_updates=True,
    )
    assert ROLLOUT_ENGINES["hf"].capabilities(None) == RolloutCapabilities(shares_model=True)


def test_the_engines_get_the_policys_attention_and_vllm_says_once_it_ignores_it(
    register: Register,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = register("toy_attention", RolloutCapabilities())
    engines = RolloutEngines(
        EnginesSection(rollout=name),
        policy_dtype="float32",
        attn_implementation="eager",
        seed=0,
        log_dir=tmp_path / "logs",
        scratch_dir=tmp_path / "scratch",
    )
    engines.engine(name, "rollout", tmp_path / "p0", None, build_char_tokenizer(), 4)
    assert BUILT[-1].attn_implementation == "eager"  # an engine's own copy loads with it
    monkeypatch.setattr(vllm_rollout, "VLLMRolloutEngine", lambda **options: options)
    request = replace(BUILT[-1], attn_implementation="sdpa")
    with caplog.at_level(logging.WARNING, logger=static_decode.__name__):
        for _ in range(2):
            ROLLOUT_ENGINES["vllm"].build(request, VLLMSettings(python=sys.executable))
    said = [r.message for r in caplog.records if "attn_implementation" in r.message]
    assert said == [
        "policy.attn_implementation = sdpa does not apply to the vllm rollout engine: vLLM "
        "picks its own attention backend"
    ]
