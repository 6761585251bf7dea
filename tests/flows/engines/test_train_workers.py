"""Long-lived training ranks (engines.train_workers = ray): two gloo ranks on Ray actors give
the single-process torch engine's update, and keep their processes from step to step.

Tolerance: the ranks run the same fp32 loss code and the same torch AdamW as TorchEngine;
two ranks only reorder float sums (each rank's share of a mini-batch, then a gradient
all-reduce; DeepSpeed also flattens ZeRO partitions). Each reordering moves a value by ~1
ulp (6e-8 relative); the engine tests measure <= 3e-7 after 4 optimizer steps of lr 1e-2
that move the weights by > 1e-2, so 2e-6 per weight and per loss metric is a few times the
round-off and far below what a lost micro-batch, a wrong gradient scale (x2: the mean DDP
takes instead of the sum) or a missing clip moves (>= 1e-3).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch

from flows.config import GRPOStageSection, ItergrpoConfig
from flows.engines.policy_updaters import (
    InProcessUpdater,
    build_policy_updater,
    stage_holds_policy_weights,
)
from flows.engines.train_engines import build_policy_engine
from flows.engines.train_workers import RankGroup, RayWorkersUpdater, ranks_live_for_run
from flows.engines_config import EnginesSection
from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.engines.sharded_rollout import PromptShardedEngines
from grpo_core.engines.train import OPTIMIZER_STATE_FILE
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import (
    build_char_tokenizer,
    create_tiny_policy,
    holds_weights,
    load_policy,
)
from tests.rollout_members import GlooReceiver

needs_ray = pytest.mark.skipif(find_spec("ray") is None, reason="ray is not installed")
needs_deepspeed = pytest.mark.skipif(find_spec("deepspeed") is None, reason="no deepspeed")

TOL = 2e-6
EMBED = "model.embed_tokens.weight"
# 8 rows, 2 mini-batches of 4 per epoch, 2 epochs: 4 optimizer steps, each rank 2 rows of
# each mini-batch; clipping below the measured norms; KL against a reference.
GRPO = {
    "steps": 2,
    "prompts_per_step": 2,
    "group_size": 4,
    "algo": {
        "mu": 2,
        "mini_batches_per_epoch": 2,
        "lr": 1e-2,
        "beta": 0.04,
        "max_grad_norm": 0.5,
        "warmup_steps": 1,
    },
}

pytestmark = [needs_ray, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A Ray on loopback for this module's tests, stopped after them."""
    import ray

    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=2)
    yield ray
    ray.shutdown()


def saved_policy(path: Path) -> Path:
    tokenizer = build_char_tokenizer()
    policy = create_tiny_policy(PolicyConfig(hidden_size=32, intermediate_size=64), tokenizer)
    policy.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def ragged_batch(rows: int, vocab: int) -> tuple[PolicyBatch, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab, (2 + i % 3,), generator=gen).tolist() for i in range(rows)]
    outputs = [
        torch.randint(1, vocab, (1 + (5 * i) % 7,), generator=gen).tolist() for i in range(rows)
    ]
    batch = build_policy_batch(prompts, outputs, pad_id=0, padding_side="left")
    return batch, batch.expand_per_sequence(torch.randn(rows, generator=gen))


def engines_section(train: str) -> EnginesSection:
    return EnginesSection.model_validate({"train": train, "train_workers": "ray"})


def single_process_updates(
    policy_dir: Path, grpo: GRPOStageSection, steps: list[tuple[PolicyBatch, torch.Tensor]]
) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    model = load_policy(policy_dir)[0]
    reference = load_policy(policy_dir)[0].eval().requires_grad_(False)
    engine = build_policy_engine(EnginesSection(), grpo, model, "float32")
    updater = InProcessUpdater(engine, grpo.algo, model, reference)
    metrics = [updater.update(b, a, None, seed=s) for s, (b, a) in enumerate(steps)]
    return model.state_dict(), metrics


def two_steps_in_one_process(
    tmp_path: Path,
) -> tuple[
    Path,
    GRPOStageSection,
    list[tuple[PolicyBatch, torch.Tensor]],
    dict[str, torch.Tensor],
    tuple[dict[str, torch.Tensor], list[dict[str, float]]],
]:
    """policy_0 saved under tmp_path, the stage settings, two ragged 8-row steps, the starting
    weights, and what one process's updates make of them."""
    policy_dir = saved_policy(tmp_path / "policy_0")
    vocab = len(build_char_tokenizer())
    grpo = GRPOStageSection.model_validate(GRPO)
    steps = [ragged_batch(8, vocab), ragged_batch(8, vocab)]
    start = load_policy(policy_dir)[0].state_dict()
    return policy_dir, grpo, steps, start, single_process_updates(policy_dir, grpo, steps)


def assert_same_updates(
    want: tuple[dict[str, torch.Tensor], list[dict[str, float]]],
    got: tuple[dict[str, torch.Tensor], list[dict[str, float]]],
    start: dict[str, torch.Tensor],
) -> float:
    (want_w, want_m), (got_w, got_m) = want, got
    moved = max(float((want_w[n] - start[n]).abs().max()) for n in want_w)
    assert moved > 1e-2  # the updates really changed the weights
    gap = max(float((want_w[n] - got_w[n]).abs().max()) for n in want_w)
    assert gap < TOL, gap
    for w, g in zip(want_m, got_m, strict=True):
        assert g["optimizer_steps"] == w["optimizer_steps"] == 4
        assert g["lr"] == w["lr"]
        for key in ("loss", "policy_loss", "kl", "entropy"):
            assert g[key] == pytest.approx(w[key], abs=TOL), key
        # exp(new - old log-prob) of ~2.6: relative, as for the norm (measured 1.9e-6)
        for key in ("ratio_max", "grad_norm"):
            assert g[key] == pytest.approx(w[key], rel=1e-5), key
    return gap


@pytest.mark.slow
def test_ranks_that_cannot_be_placed_stop_the_stage_naming_the_field(tmp_path: Path) -> None:
    """GPU ranks on a CPU-only local Ray are never placed: the start times out with the
    setting named, and the local Ray the updater started is stopped again. (First in the
    module: before the module's own Ray starts.)"""
    import ray

    assert not ray.is_initialized()
    engines = EnginesSection.model_validate(
        {"train_workers": "ray", "workers": {"num_gpus_per_rank": 1, "start_timeout_s": 3}}
    )
    grpo = GRPOStageSection.model_validate(GRPO)
    policy_dir = saved_policy(tmp_path / "policy_0")
    model = load_policy(policy_dir)[0]
    with pytest.raises(SettingError, match=r"not ready within 3 s \(engines\.workers\.start_"):
        build_policy_updater(engines, grpo, 1, model, None, policy_dir, tmp_path, "float32")
    assert not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.parametrize("train", ["torch", pytest.param("deepspeed", marks=needs_deepspeed)])
def test_two_ray_ranks_update_as_one_process_in_the_same_processes(
    tmp_path: Path, local_ray: Any, train: str
) -> None:
    policy_dir, grpo, steps, start, want = two_steps_in_one_process(tmp_path)

    model = load_policy(policy_dir)[0]  # the stage's sampling copy
    updater = build_policy_updater(
        engines_section(train), grpo, 1, model, None, policy_dir, tmp_path / "jobs", "float32"
    )
    try:
        pids = []
        metrics = []
        for seed, (batch, advantages) in enumerate(steps):
            metrics.append(updater.update(batch, advantages, None, seed=seed))
            pids.append(local_ray.get([r.pid.remote() for r in updater.ranks]))
        # Two processes, neither this one, the same ones at every step.
        assert len(set(pids[0])) == 2 and os.getpid() not in pids[0]
        assert pids == [updater.pids, updater.pids]
        assert updater.weights() is None  # the stage's model holds rank 0's weights
        gap = assert_same_updates(want, (model.state_dict(), metrics), start)
        print(f"2 Ray ranks ({train}) vs one process: max |weight gap| {gap:.2e}")
    finally:
        updater.close()
    assert local_ray.is_initialized()  # a Ray the updater did not start stays up


@pytest.mark.slow
def test_ranks_resume_from_the_optimizer_state_rank_0_wrote(tmp_path: Path, local_ray: Any) -> None:
    """A progress checkpoint of two torch (DDP) ranks: rank 0 writes the optimizer state into
    it and none reaches the stage; new ranks resumed from it make the second update exactly
    as one process making both (weights, lr schedule, metrics)."""
    policy_dir, grpo, steps, start, want = two_steps_in_one_process(tmp_path)
    checkpoint, tokenizer = tmp_path / "progress", load_policy(policy_dir)[1]
    model = load_policy(policy_dir)[0]
    first = build_policy_updater(
        engines_section("torch"), grpo, 1, model, None, policy_dir, tmp_path / "j", "float32"
    )
    try:
        metrics = [first.update(*steps[0], None, seed=0)]
        first.save_weights(model, checkpoint)
        tokenizer.save_pretrained(checkpoint)
        assert first.save_state(checkpoint) is None
    finally:
        first.close()
    assert isinstance(first, RayWorkersUpdater)
    assert (checkpoint / first.state_dir / OPTIMIZER_STATE_FILE).is_file()
    resumed = load_policy(checkpoint)[0]
    second = build_policy_updater(
        engines_section("torch"), grpo, 1, resumed, None, policy_dir, tmp_path / "k", "float32"
    )
    try:
        second.load_state(checkpoint, None)
        metrics.append(second.update(*steps[1], None, seed=1))
        assert second.weights() is None  # now in the stage's model
    finally:
        second.close()
    gap = assert_same_updates(want, (resumed.state_dict(), metrics), start)
    print(f"2 Ray ranks resumed from rank 0's optimizer state vs one process: {gap:.2e}")


@pytest.mark.slow
def test_ranks_kept_for_the_run_start_each_stage_afresh(tmp_path: Path, local_ray: Any) -> None:
    """engines.workers.lifetime = run: one group serves two GRPO stages; the second loads the
    policy again with a new optimizer, so the same steps from the same policy give the same
    metrics and weights as the first, in the same two processes."""
    policy_dir = saved_policy(tmp_path / "policy_0")
    vocab = len(build_char_tokenizer())
    grpo = GRPOStageSection.model_validate(GRPO)
    steps = [ragged_batch(8, vocab), ragged_batch(8, vocab)]
    engines = engines_section("torch")
    group = RankGroup(engines.workers, 1, None)
    try:
        stages = []
        for _ in range(2):
            model = load_policy(policy_dir)[0]
            updater = build_policy_updater(
                engines, grpo, 1, model, None, policy_dir, tmp_path / "jobs", "float32", None, group
            )
            metrics = [updater.update(b, a, None, seed=s) for s, (b, a) in enumerate(steps)]
            updater.weights()
            updater.close()  # the stage's end: the ranks stay
            stages.append((model.state_dict(), metrics, list(group.pids)))
            assert len(group.ranks) == 2
        (w1, m1, pids1), (w2, m2, pids2) = stages
        assert m2 == m1 and all(torch.equal(w2[n], w1[n]) for n in w1)
        assert pids1 == pids2 and len(set(pids1)) == 2
    finally:
        group.close()
    assert local_ray.is_initialized()  # a Ray the group did not start stays up


def test_ranks_live_for_the_run_unless_ray_shards_need_their_reservations() -> None:
    assert ranks_live_for_run("auto", shards_sample=False)
    assert not ranks_live_for_run("auto", shards_sample=True)
    assert ranks_live_for_run("run", shards_sample=True)
    assert not ranks_live_for_run("stage", shards_sample=False)


@pytest.mark.slow
def test_rank_0_broadcasts_each_update_to_the_engines_without_the_stage_holding_it(
    tmp_path: Path, local_ray: Any
) -> None:
    """With a follower that takes a broadcast (vLLM's workers, here threads on real gloo),
    rank 0 broadcasts its updated weights to them itself: the stage's model keeps its old
    weights until it is saved or samples (hand_on(None))."""
    policy_dir = saved_policy(tmp_path / "policy_0")
    vocab = len(build_char_tokenizer())
    grpo = GRPOStageSection.model_validate(GRPO)
    model = load_policy(policy_dir)[0]
    start = {n: t.clone() for n, t in model.state_dict().items()}
    members = [GlooReceiver(), GlooReceiver()]
    engines = PromptShardedEngines(members, broadcast_timeout_s=60)
    updater = build_policy_updater(
        engines_section("torch"), grpo, 1, model, None, policy_dir, tmp_path / "jobs", "float32"
    )
    try:
        for seed in range(2):
            updater.update(*ragged_batch(8, vocab), None, seed=seed)
            updater.hand_on(engines)
            assert all(torch.equal(t, start[n]) for n, t in model.state_dict().items())
        assert updater.weights() is None  # now the stage's model holds rank 0's weights
        trained = model.state_dict()
        for member in members:
            first, last = member.received
            assert set(last) <= set(trained) and EMBED in last
            assert all(torch.equal(last[n], trained[n]) for n in last)
            assert not torch.equal(first[EMBED], start[EMBED])  # the first update's weights
            assert not torch.equal(first[EMBED], last[EMBED])
        assert isinstance(updater, RayWorkersUpdater) and updater.source.backend == "gloo"
    finally:
        updater.close()


@pytest.mark.slow
@pytest.mark.parametrize("train", ["torch", pytest.param("deepspeed", marks=needs_deepspeed)])
def test_two_ray_ranks_train_a_reward_model_as_one_process(
    tmp_path: Path, local_ray: Any, train: str
) -> None:
    """engines.workers.reward_models: 9 examples in batches of 4 over 2 epochs, so each
    rank takes 2 of a full batch and rank 1 runs the last batch's weight-0 padding pass;
    the same metrics, rows and weights as train_reward_model in one process."""
    from flows.engines.train_workers import train_reward_model_on_ranks
    from reward_models.config import RewardModelConfig
    from reward_models.training import train_reward_model
    from tests.reward_models.test_training import fresh_rm, orm_set

    examples = orm_set(9, "new", 0)
    cfg = RewardModelConfig(epochs=2, batch_size=4, lr=3e-3)
    start = fresh_rm().state_dict()
    single = fresh_rm()
    want_metrics, want_rows = train_reward_model(single, examples, cfg, seed=5, progress=False)
    engines = EnginesSection.model_validate(
        {"train": train, "train_workers": "ray", "workers": {"reward_models": True}}
    )
    metrics, rows, weights = train_reward_model_on_ranks(
        None, engines, 1, None, fresh_rm(), examples, cfg, 5, tmp_path / "start"
    )
    assert not (tmp_path / "start").exists() and local_ray.is_initialized()
    assert rows == want_rows and metrics.keys() == want_metrics.keys()
    for key, value in want_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5), key
    assert metrics["loss_last_epoch"] < metrics["loss_first_epoch"]
    trained = single.state_dict()
    moved = max(float((trained[n] - start[n]).abs().max()) for n in trained)
    gap = max(float((trained[n] - weights[n]).abs().max()) for n in trained)
    print(
        f"RM on 2 Ray ranks ({train}) vs one process: max |weight gap| {gap:.2e}, moved {moved:.2e}"
    )
    assert moved > 1e-3 and gap < TOL, gap


class RecordingFollower:
    """A sampling engine that takes each policy as a state dict (no broadcast)."""

    def __init__(self) -> None:
        self.received: list[dict[str, torch.Tensor]] = []

    def receive_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.received.append(weights)


@pytest.mark.slow
def test_a_stage_without_the_weights_saves_and_hands_on_rank_0s(
    tmp_path: Path, local_ray: Any
) -> None:
    """Where the stage's sampling does not use its model (vLLM, gold solutions, policy_0),
    the stage holds a skeleton: a follower gets rank 0's weights, rank 0 writes the saved
    policy itself, and both are the single process's updates."""
    policy_dir, grpo, steps, start, want = two_steps_in_one_process(tmp_path)
    skeleton, tokenizer = load_policy(policy_dir, weights=False)
    updater = build_policy_updater(
        engines_section("torch"), grpo, 1, skeleton, None, policy_dir, tmp_path / "j", "float32"
    )
    follower = RecordingFollower()
    try:
        metrics = []
        for seed, (batch, advantages) in enumerate(steps):
            metrics.append(updater.update(batch, advantages, None, seed=seed))
            updater.hand_on(follower)
        weights = updater.weights()
        assert weights is not None and not holds_weights(skeleton)

        def not_here(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("the stage wrote the weights")

        skeleton.save_pretrained = not_here  # type: ignore[method-assign]
        updater.save_weights(skeleton, tmp_path / "policy_1")
        tokenizer.save_pretrained(tmp_path / "policy_1")
    finally:
        updater.close()
    saved = load_policy(tmp_path / "policy_1")[0].state_dict()
    assert all(torch.equal(weights[n], saved[n]) for n in weights)
    gap = assert_same_updates(want, (saved, metrics), start)
    print(f"skeleton stage, 2 Ray ranks vs one process: max |weight gap| {gap:.2e}")
    first, last = follower.received
    assert all(torch.equal(last[n], saved[n]) for n in last) and EMBED in last
    assert not torch.equal(first[EMBED], last[EMBED])  # each update handed on


def test_the_stage_keeps_policy_weights_only_where_it_computes_with_them() -> None:
    def holds(*sets: dict[str, Any]) -> bool:
        cfg = ItergrpoConfig.model_validate(
            {"engines": {"train_workers": "ray", **sets[0]}, "grpo": sets[1] if sets[1:] else {}}
        )
        return stage_holds_policy_weights(cfg.engines, cfg.grpo)

    assert holds({})  # the hf engine samples the stage's model
    assert not holds({"rollout": "vllm"})
    assert not holds({}, {"preset": "sft"}) and not holds({}, {"preset": "rft"})
    assert holds({"rollout": "vllm"}, {"preset": "ppo"})
    in_process = ItergrpoConfig.model_validate({"engines": {"rollout": "vllm"}})
    assert stage_holds_policy_weights(in_process.engines, in_process.grpo)


def test_train_workers_settings_name_the_field() -> None:
    cfg = ItergrpoConfig.model_validate({"engines": {"train_workers": "ray"}})
    assert cfg.engines.workers.ranks == 2 and not cfg.engines.updates_in_process
    assert ItergrpoConfig().engines.updates_in_process
    with pytest.raises(ValueError, match=r"engines\.train_workers\n.*'none' or 'ray'"):
        ItergrpoConfig.model_validate({"engines": {"train_workers": "slurm"}})
    with pytest.raises(ValueError, match=r"processes_per_node at 1"):
        EnginesSection.model_validate(
            {"train": "deepspeed", "train_workers": "ray", "deepspeed": {"processes_per_node": 2}}
        )
    with pytest.raises(ValueError, match=r"num_gpus_per_rank = 1 with run.device = cpu"):
        ItergrpoConfig.model_validate(
            {
                "run": {"device": "cpu"},
                "engines": {"train_workers": "ray", "workers": {"num_gpus_per_rank": 1}},
            }
        )
    with pytest.raises(ValueError, match=r"engines\.workers\.ranks"):
        ItergrpoConfig.model_validate({"engines": {"workers": {"ranks": 0}}})
    with pytest.raises(ValueError, match=r"set engines\.train_workers: ray, or reward_models"):
        ItergrpoConfig.model_validate({"engines": {"workers": {"reward_models": True}}})


def test_missing_ray_names_the_field_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.engines import availability

    cfg = ItergrpoConfig.model_validate({"engines": {"train_workers": "ray"}})
    availability.check_engines(cfg.engines)  # ray is installed here
    monkeypatch.setattr(availability, "find_spec", lambda name: None)
    with pytest.raises(SettingError) as err:
        availability.check_engines(cfg.engines)
    message = str(err.value)
    assert "engines.train_workers = ray" in message and "pip install -e '.[ray]'" in message
    assert "engines.train_workers: none" in message
    availability.check_engines(ItergrpoConfig().engines)  # the default needs no ray


def test_a_rank_loads_the_policy_and_its_reference_with_the_policys_attention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.engines import policy_rank
    from grpo_core.algo.config import GRPOConfig
    from grpo_core.engines.train import TorchEngine

    tokenizer = build_char_tokenizer()
    create_tiny_policy(PolicyConfig(), tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    # a one-process engine in place of DDP's, which needs a process group
    monkeypatch.setattr(policy_rank, "RANK_ENGINES", {"torch": lambda m, o, e: TorchEngine(m, o)})
    rank = policy_rank.PolicyRank(0, 1, cuda=False, threads=None)
    algo = GRPOConfig(beta=0.04)  # the loss reads the reference
    rank.load(EnginesSection(), algo, 1, str(tmp_path), str(tmp_path), "float32", "eager")
    assert rank.model is not None and rank.reference is not None
    assert rank.model.config._attn_implementation == "eager"
    assert rank.reference.config._attn_implementation == "eager"
