"""engines.vllm.sleep_while_training, as far as it runs without a GPU: what the engine asks of
its worker and in which order (a protocol stand-in, tests/fake_vllm_worker.py, takes vLLM's
place: vLLM's CPU backend has no sleep mode), the GRPO sampler that sleeps after sampling,
and the setting's refusal on CPU. vLLM's own sleep and wake on a GPU: not run here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flows.engines.sampling import SleepsAfterSampling
from flows.errors import ConfigError
from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines import vllm_rollout
from grpo_core.engines.registry import vllm_engine_options
from grpo_core.engines.sharded_rollout import PromptShardedEngines
from grpo_core.model.policy import build_char_tokenizer
from tests.flow_helpers import micro_config
from tests.flows.engines.test_train_workers import saved_policy
from tests.rollout_members import PlaceSeededEngine

FAKE_WORKER = Path(__file__).parents[2] / "fake_vllm_worker.py"
PARAMS = SamplingParams(max_new_tokens=1, temperature=1.0)


def test_a_sleeping_worker_is_woken_by_its_next_request_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = tmp_path / "ops.txt"
    monkeypatch.setattr(vllm_rollout, "WORKER_SCRIPT", FAKE_WORKER)
    policy_a, policy_b = saved_policy(tmp_path / "a"), saved_policy(tmp_path / "b")
    engine = vllm_rollout.VLLMRolloutEngine(
        policy_a, python=sys.executable, env={"FAKE_VLLM_OPS": str(ops)}
    )
    try:
        sampler = SleepsAfterSampling(engine)
        batch = sampler.generate(["1+1", "2+1"], 2, PARAMS, seed=0)  # then asleep
        assert batch.completion_ids == [[5]] * 4
        engine.sleep()  # already asleep: nothing sent
        sampler.generate(["1+1"], 1, PARAMS, seed=1)  # woken first, asleep again after
        engine.load(policy_b)  # the next policy wakes it
        engine.sleep()
    finally:
        engine.close()  # a sleeping worker shuts down without waking
    assert ops.read_text().split() == [
        "generate",
        "sleep",
        "wake",
        "generate",
        "sleep",
        "wake",
        "reload",
        "sleep",
        "shutdown",
    ]


def test_a_group_sleeps_every_member() -> None:
    members = [PlaceSeededEngine(), PlaceSeededEngine()]
    PromptShardedEngines(members).sleep()
    assert all(member.slept == 1 for member in members)


def test_sleep_mode_asks_vllm_for_it_and_is_refused_on_cpu(tmp_path: Path) -> None:
    sleeps = ("engines.rollout=vllm", "engines.vllm.sleep_while_training=true")
    on = micro_config(tmp_path, "s", *sleeps, "run.device=cuda")
    assert on.engines.vllm.sleep_while_training
    with pytest.raises(ConfigError, match=r"sleep_while_training needs a GPU"):
        micro_config(tmp_path, "s", *sleeps)  # the micro preset runs on cpu
    from grpo_core.engines.registry import RolloutRequest

    request = RolloutRequest(
        checkpoint_dir=tmp_path, tokenizer=build_char_tokenizer(), model=None, batch_size=8,
        purpose="grpo", dtype="float32", prefix_caching=True, seed=0,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("grpo_core.engines.registry.find_vllm_python", lambda given: Path("py"))
        kwargs = vllm_engine_options(request, on.engines.vllm)["llm_kwargs"]
    assert kwargs["enable_sleep_mode"] is True
