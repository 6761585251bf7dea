"""A `micro` run with grpo.lora: each GRPO stage loads policy_k once (the reference is the base
with the adapters off), stores the adapters in PEFT format and policy_{k+1} merged, every
iteration is evaluated, and a run killed mid-GRPO resumes to the same rows and weights."""

from __future__ import annotations

import inspect
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from safetensors.torch import load_file

from flows.context import RunContext
from flows.engines.lora_updater import ADAPTERS_DIR
from flows.loop import execute_run
from flows.names import GRPO_PROGRESS, POLICY, POLICY_LORA
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.registry import ROLLOUT_ENGINES, RolloutEngineSpec, RolloutRequest
from grpo_core.model.config import LLAMA_PROJECTIONS
from grpo_core.model.lora import ADAPTER_WEIGHTS
from grpo_core.model.policy import load_policy
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import cli, micro_config, snapshot

# where the GRPO stage loads policy_k: its set-up and its parts' builders
GRPO_STAGE_MODULES = ("flows.stages.grpo", "flows.stages.grpo_parts")

pytest.importorskip("peft", reason="the lora extra (pip install -e '.[lora]') is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning"),
]
RUN_ID = "lora"
LORA = ("grpo.lora.enabled=true", "grpo.lora.r=4", "grpo.algo.lr=1e-3")


def weights(store: Path, role: str, k: int, file: str = "model.safetensors") -> dict:
    return load_file(str(checkpoint_path(store, RUN_ID, role, k) / file))


def test_lora_run_stores_adapters_and_merged_policies_and_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peft import PeftModel

    loads_by_grpo: list[int] = []
    policy = RunContext.policy

    def counting_policy(ctx: RunContext, k: int, weights: bool = True):  # type: ignore[no-untyped-def]
        if inspect.stack()[1].frame.f_globals["__name__"] in GRPO_STAGE_MODULES:
            loads_by_grpo.append(k)
        return policy(ctx, k, weights)

    monkeypatch.setattr(RunContext, "policy", counting_policy)
    reference = tmp_path / "reference"
    # its progress checkpoints kept, to check what one holds (removed at the commit otherwise)
    cfg = micro_config(reference, RUN_ID, *LORA, "store.progress_checkpoints=keep")
    assert cfg.grpo.algo.beta > 0  # the KL term runs: the adapters-off reference is used
    execute_run(cfg)
    assert loads_by_grpo == [0, 1]  # one copy of policy_k per GRPO stage, no reference copy

    for k in (1, 2):
        merged, before = weights(reference, POLICY, k), weights(reference, POLICY, k - 1)
        assert set(merged) == set(before)  # an ordinary HF checkpoint: no adapter keys
        changed = {key for key in merged if not torch.equal(merged[key], before[key])}
        assert changed, f"GRPO of iteration {k - 1} changed nothing"
        # the base was frozen: only the adapted projections moved (embeddings, norms did not)
        assert {key.split(".")[-2] for key in changed} <= set(LLAMA_PROJECTIONS)
        # PEFT's own loader: policy_{k-1} + the stored adapters = the stored merged policy_k
        base, tokenizer = load_policy(checkpoint_path(reference, RUN_ID, POLICY, k - 1))
        adapters = checkpoint_path(reference, RUN_ID, POLICY_LORA, k)
        with_adapters = PeftModel.from_pretrained(base, adapters).eval()
        plain, _ = load_policy(checkpoint_path(reference, RUN_ID, POLICY, k))
        ids = torch.tensor([tokenizer("1+2=3\n1+1=")["input_ids"]])
        with torch.no_grad():
            torch.testing.assert_close(
                with_adapters(input_ids=ids).logits, plain(input_ids=ids).logits
            )
    progress = checkpoint_path(reference, RUN_ID, GRPO_PROGRESS, 1)
    assert (progress / ADAPTERS_DIR / ADAPTER_WEIGHTS).is_file()
    assert not (progress / "model.safetensors").exists()  # adapters + optimizer, no full copy
    want = snapshot(RunStore(reference), RUN_ID)
    assert {r["policy_iteration"] for r in want["eval"]} == {0, 1, 2}

    store = tmp_path / "killed"
    sets = [arg for override in LORA for arg in ("--set", override)]
    args = ("run", "--config", "micro", "--run-id", RUN_ID, *sets)
    # The resume is compared with an uninterrupted run in a fresh process, as the killed and
    # resumed ones are: after the whole suite, the in-process run's KL differed from theirs in
    # the 8th digit (float rounding that depends on what the test process ran before).
    fresh = tmp_path / "fresh"
    assert cli(fresh, *args).returncode == 0
    want = snapshot(RunStore(fresh), RUN_ID)
    reference = fresh
    killed = cli(store, *args, fault="SIGKILL@grpo:1:2")  # step 0 checkpointed, step 1 not
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = cli(store, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    assert snapshot(RunStore(store), RUN_ID) == want
    for role, file in [(POLICY, "model.safetensors"), (POLICY_LORA, ADAPTER_WEIGHTS)]:
        got, expected = weights(store, role, 2, file), weights(reference, role, 2, file)
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[key], expected[key]) for key in got), role


class OwnCopyEngine:
    """A rollout engine registered by a test: HF on its own copy of the policy, given the
    trained weights after each update as a vLLM worker is; records what it receives."""

    received: ClassVar[list[dict[str, torch.Tensor]]] = []

    def __init__(self, request: RolloutRequest, settings: None) -> None:
        model = load_policy(request.checkpoint_dir)[0]
        self.hf = HFRolloutEngine(
            model, request.tokenizer, batch_size=request.batch_size, show_progress=False
        )

    def load(self, checkpoint_dir: Path) -> None:
        self.hf.load(checkpoint_dir)

    def receive_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        OwnCopyEngine.received.append({k: v.detach().clone() for k, v in weights.items()})
        self.hf.receive_weights(weights)  # a key the plain model lacks is a KeyError

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        return self.hf.generate(prompts, n, params, seed=seed)

    def close(self) -> None:
        pass


@pytest.fixture
def own_copy_engine() -> Iterator[str]:
    spec = RolloutEngineSpec("own-copy", "test: HF on its own weights", OwnCopyEngine)
    ROLLOUT_ENGINES.add("own-copy", spec)
    OwnCopyEngine.received.clear()
    yield "own-copy"
    ROLLOUT_ENGINES.remove("own-copy")


def test_an_engine_on_its_own_weights_is_sent_the_merged_policy(
    own_copy_engine: str, tmp_path: Path
) -> None:
    """What vLLM gets in the GRPO stage: after each update, the merged weights under the plain
    model's keys, which differ from policy_0 in the adapted projections only."""
    cfg = micro_config(
        tmp_path, RUN_ID, *LORA, "run.iterations=1", f"engines.rollout={own_copy_engine}"
    )
    execute_run(cfg)
    received = OwnCopyEngine.received
    assert len(received) == cfg.grpo.steps - 1  # after every update but the last
    start = load_policy(checkpoint_path(tmp_path, RUN_ID, POLICY, 0))[0].state_dict()
    for sent in received:
        assert set(sent) == set(start)
        changed = {key for key in sent if not torch.equal(sent[key], start[key])}
        assert changed and {key.split(".")[-2] for key in changed} <= set(LLAMA_PROJECTIONS)
    assert not all(torch.equal(received[0][k], received[1][k]) for k in start)  # it follows
