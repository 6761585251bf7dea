"""The extension points carry their own rules: a test registers a toy advantage estimator
and a toy reward part, and the config accepts them, checks what they need and the GRPO
reward uses them, with no other file touched (docs/extending.md walks through the same)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from flows.config_files import load_config
from flows.errors import ConfigError
from flows.loop import execute_run
from grpo_core.algo.advantages import AdvantageInputs
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.estimators import ADVANTAGE_ESTIMATORS, register_adv_estimator
from grpo_core.algo.rewards import token_advantages
from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.registry import Registry
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Problem
from grpo_core.engines.registry import (
    ROLLOUT_ENGINES,
    RolloutCapabilities,
    RolloutEngineSpec,
    RolloutRequest,
)
from grpo_core.model.policy import build_char_tokenizer
from reward_models.grpo_reward import GRPORewarder
from reward_models.parts import REWARD_PARTS, RewardPart, ScoringContext, register_reward_part
from storage.store import RunStore
from tests.flow_helpers import REPO, micro_config, snapshot


def test_a_registry_names_its_choices_and_refuses_a_second_entry_of_a_name() -> None:
    colours: Registry[int] = Registry("colour")
    colours.add("red", 1)
    colours.add("blue", 2)
    assert colours["blue"] == 2 and colours.names() == ["red", "blue"] and "red" in colours
    with pytest.raises(
        SettingError, match=r"unknown colour 'green': choose one of \['red', 'blue'\]"
    ):
        colours["green"]
    with pytest.raises(ValueError, match="'red' is registered twice"):
        colours.add("red", 3)
    schema: dict[str, Any] = {}
    colours.json_schema(schema)
    assert schema == {"enum": ["red", "blue"]}


def test_every_built_in_estimator_resolves_and_is_a_choice_of_the_config() -> None:
    schema = GRPOConfig.model_json_schema()["properties"]["adv_estimator"]
    assert schema["enum"] == ADVANTAGE_ESTIMATORS.names()
    for name, spec in ADVANTAGE_ESTIMATORS.items():
        assert callable(spec.fn), name
        assert spec.summary in schema["description"]
    assert GRPOConfig(adv_estimator="grpo_process").process_supervision
    assert not GRPOConfig(adv_estimator="dr_grpo").process_supervision


def _last_token_only(inputs: AdvantageInputs, eps: float) -> torch.Tensor:
    """A toy estimator: the reward on each output's last response token, 0 elsewhere."""
    assert inputs.rewards is not None
    mask = inputs.response_mask
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)
    return inputs.rewards.reshape(-1, 1) * last


@pytest.fixture
def toy_estimator() -> Iterator[str]:
    register_adv_estimator(
        "last_token", _last_token_only, reads={"rewards"}, summary="toy: reward on the last token"
    )
    register_adv_estimator(
        "toy_steps", _last_token_only, reads={"step_rewards"}, summary="toy: reads PRM steps"
    )
    yield "last_token"
    ADVANTAGE_ESTIMATORS.remove("last_token")
    ADVANTAGE_ESTIMATORS.remove("toy_steps")


def test_a_registered_estimator_is_configurable_and_its_needs_are_checked(
    toy_estimator: str,
) -> None:
    from grpo_core.algo.estimators import VERIFIER
    from grpo_core.algo.rewards import StepRewards

    cfg = load_config("micro", [f"grpo.algo.adv_estimator={toy_estimator}"])
    assert GRPOConfig.model_json_schema()["properties"]["adv_estimator"]["enum"][-2:] == [
        "last_token",
        "toy_steps",
    ]
    rewards = StepRewards(torch.tensor([2.0, 3.0]), {VERIFIER: torch.zeros(2)}, None)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    got = token_advantages(cfg.grpo.algo, rewards, mask, (1, 2))
    assert got.tolist() == [[0.0, 2.0, 0.0], [3.0, 0.0, 0.0]]
    # what it declares it reads is what the config checks: step rewards need a trained PRM
    with pytest.raises(ConfigError, match="adv_estimator = toy_steps rewards each step"):
        load_config("micro", ["grpo.algo.adv_estimator=toy_steps", "reward_models.use_prm=false"])
    # and the weighted reward needs a weight
    with pytest.raises(ConfigError, match="are all 0"):
        load_config(
            "micro",
            [f"grpo.algo.adv_estimator={toy_estimator}"]
            + [f"grpo.rewards.{name}=0" for name in REWARD_PARTS],
        )


def _brevity(context: ScoringContext, options: Mapping[str, Any]) -> list[float]:
    """A toy part: 1 for an empty output, falling linearly to 0 at the token budget (times
    the part's own `scale` option)."""
    budget = context.max_new_tokens
    return [
        options["scale"] * max(0.0, 1.0 - len(ids) / budget) for ids in context.batch.completion_ids
    ]


@pytest.fixture
def toy_part() -> Iterator[str]:
    from pydantic import Field

    register_reward_part(
        RewardPart(
            name="brevity",
            score=_brevity,
            description="toy: shorter is better",
            options={"scale": (float, Field(1.0, gt=0))},
        )
    )
    yield "brevity"
    REWARD_PARTS.remove("brevity")


def test_a_registered_reward_part_is_weighted_scored_and_kept_by_name(toy_part: str) -> None:
    cfg = load_config(
        "micro",
        ["grpo.rewards.orm=0", "grpo.rewards.brevity=0.5", "grpo.rewards.brevity_scale=2.0"],
    )
    weights = cfg.grpo.rewards
    assert weights.weights() == {
        **{name: 0.0 for name in REWARD_PARTS},  # in summing order, the new part last
        "verifier": 1.0,
        "brevity": 0.5,
    }
    assert list(weights.weights())[-1] == "brevity"
    assert weights.options("brevity") == {"scale": 2.0}
    tok = build_char_tokenizer()
    texts = ["1+1=2\n#### 2", "#### 3"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    batch = RolloutBatch(
        [0, 0], [[1], [1]], ids, texts, ["stop", "stop"], [[0.0] * len(i) for i in ids]
    )
    rewarder = GRPORewarder(ArithTask(), weights, tok, max_new_tokens=20)
    rewards = rewarder([Problem("p0", "1+1", "2")], ["Q"], batch)
    brevity = [2.0 * (1 - len(ids[0]) / 20), 2.0 * (1 - len(ids[1]) / 20)]
    assert set(rewards.parts) == {"verifier", "format", "brevity"}  # orm: weight 0, not scored
    assert rewards.parts["brevity"].tolist() == pytest.approx(brevity)
    verifier = [1.0, 0.0]
    want = [v + 0.5 * b for v, b in zip(verifier, brevity, strict=True)]
    assert rewards.total.tolist() == pytest.approx(want)
    assert rewards.rm is None  # not a learned part
    # the part's own settings are checked like any field
    with pytest.raises(ConfigError, match="brevity_scale: Input should be greater than 0"):
        load_config("micro", ["grpo.rewards.brevity_scale=0"])


def test_an_unknown_reward_part_is_refused_naming_the_fields() -> None:
    with pytest.raises(ConfigError, match=r"no reward part or option 'lenght'.*'prm_aggregation'"):
        load_config("micro", ["grpo.rewards.lenght=1"])


def test_a_reward_part_needing_an_untrained_model_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"grpo.rewards.prm > 0 needs reward_models.use_prm"):
        load_config("micro", ["grpo.rewards.prm=1", "reward_models.use_prm=false"])


def test_loading_a_config_imports_neither_torch_nor_prefect() -> None:
    """The registries the config reads are declarations: a run is refused without importing
    the ML stack (its modules load when a stage needs them), nor a tracker it selects."""
    code = (
        "import sys\n"
        "from flows.config_files import load_config\n"
        "load_config('demo', ['tracking.mlflow.uri=http://127.0.0.1:1', "
        "'tracking.tensorboard=true'])\n"
        "heavy = ('torch', 'transformers', 'prefect', 'mlflow', 'tensorboard')\n"
        "print('heavy:', sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert "heavy: []" in done.stdout, done.stdout + done.stderr


class RecordingEngine:
    """A rollout engine registered by a test: the HF engine on its own copy of the policy
    (loaded from the checkpoint, then given the trained weights, as a vLLM worker is), which
    records its life."""

    def __init__(self, request: RolloutRequest, settings: None) -> None:
        from grpo_core.engines.hf_rollout import HFRolloutEngine
        from grpo_core.model.policy import load_policy

        model = load_policy(request.checkpoint_dir)[0]
        self.hf = HFRolloutEngine(
            model, request.tokenizer, batch_size=request.batch_size, show_progress=False
        )
        self.events: list[tuple[str, str]] = [("start", request.checkpoint_dir.parent.name)]
        RECORDED.append(self)

    def load(self, checkpoint_dir: Path) -> None:
        self.events.append(("load", checkpoint_dir.parent.name + "/" + checkpoint_dir.name))
        self.hf.load(checkpoint_dir)

    def receive_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.events.append(("weights", ""))
        self.hf.receive_weights(weights)

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        return self.hf.generate(prompts, n, params, seed=seed)

    def close(self) -> None:
        self.events.append(("close", ""))


RECORDED: list[RecordingEngine] = []


@pytest.fixture
def recording_engine() -> Iterator[str]:
    spec = RolloutEngineSpec(
        "recording",
        "test: HF on its own weights",
        RecordingEngine,
        capabilities=lambda settings: RolloutCapabilities(keeps_process=True),
    )
    ROLLOUT_ENGINES.add("recording", spec)
    RECORDED.clear()
    yield "recording"
    ROLLOUT_ENGINES.remove("recording")


@pytest.mark.slow
def test_a_registered_rollout_engine_lives_for_the_run_and_samples_what_hf_samples(
    recording_engine: str, micro_run: tuple[RunStore, str], tmp_path: Path
) -> None:
    """Kept for the run: started once, given each stage's policy by `load` and each GRPO
    update by `receive_weights` (not after the last step), closed at the end. Sampling its own
    copy of the weights, it gives the rows and evaluations of the HF engine's run, exactly."""
    store, run_id = micro_run
    cfg = micro_config(tmp_path, run_id, f"engines.rollout={recording_engine}")
    execute_run(cfg)
    assert len(RECORDED) == 1
    events = RECORDED[0].events
    assert events[0] == ("start", "policy") and events[-1] == ("close", "")
    g, iterations = cfg.grpo, cfg.run.iterations
    assert events.count(("weights", "")) == iterations * (g.steps - 1)
    loaded = [where for what, where in events if what == "load"]
    for k in range(iterations):  # the GRPO stage starts from policy_k, evaluation is k + 1
        assert f"policy/iter-{k}" in loaded and f"policy/iter-{k + 1}" in loaded
    assert snapshot(RunStore(tmp_path), run_id) == snapshot(store, run_id)
