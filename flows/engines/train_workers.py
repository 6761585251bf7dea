"""Long-lived training ranks (engines.train_workers = ray): the GRPO update on Ray actors that
live for the whole run (or each GRPO stage: engines.workers.lifetime), each one rank of a
torch.distributed group (gloo on CPU, NCCL on GPU) running DeepSpeedEngine (engines.train =
deepspeed) or the torch engine under DDP (engines.train = torch); the actor body is
flows/engines/policy_rank.py. Each step's batch and advantages go to the ranks once through
Ray's object store. Rank 0 keeps its updated weights: it broadcasts them itself to the vLLM
engines' workers (one gloo/NCCL group, `RankWeights`), and sends them back to the stage only
when the stage's model needs them (it samples with that model, or saves a checkpoint). The
ranks write and read the optimizer state of the stage's progress checkpoints themselves.
Why actors and not launcher jobs, and how it runs on a cluster: docs/train_workers.md.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from flows.config import GRPOStageSection
from flows.engines.policy_rank import PolicyRank
from flows.engines.ray_runtime import start_ray
from flows.engines.train_engines import grpo_total_steps
from flows.engines_config import EnginesSection
from flows.progress import log
from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.policy_batch import PolicyBatch, update_tensors
from grpo_core.contracts.rollout import RolloutEngine
from grpo_core.engines.config import TrainWorkersConfig
from grpo_core.engines.sharded_rollout import TakesBroadcast
from grpo_core.model.policy import holds_weights, without_tied_copies
from reward_models.config import RewardModelConfig
from reward_models.models import RewardModel
from reward_models.pairwise import TrainingMix
from reward_models.training import TrainedRow

START_TIMEOUT_SETTING = "engines.workers.start_timeout_s"


class RankWeights:
    """The WeightSource of training rank 0 (an actor), as the stage's rollout engine sees it:
    the vLLM workers join rank 0's group and receive its broadcast, while the stage process
    only passes the calls on."""

    def __init__(self, updater: RayWorkersUpdater) -> None:
        self.updater = updater
        self.backend = ""

    def open_sync(self, world_size: int, timeout_s: float, backend: str) -> tuple[str, int, str]:
        args = (world_size, timeout_s, backend)
        host, port, self.backend = self.updater.on_rank0("open_sync", *args)
        return host, port, self.backend

    def connect(self) -> None:
        self.updater.on_rank0("connect_sync", self.backend)

    def manifest(self) -> list[list[object]]:
        self.updater.gather_once()
        listed: list[list[object]] = self.updater.on_rank0("sync_manifest")
        return listed

    def send(self) -> int:
        sent: int = self.updater.on_rank0("broadcast_weights")
        return sent


def ranks_live_for_run(lifetime: str, shards_sample: bool) -> bool:
    """engines.workers.lifetime resolved: `auto` keeps the ranks for the run unless Ray shards
    sample on the same Ray (ranks held through the sampling stages keep the CPUs/GPUs they
    reserve from the shards, which then wait for them)."""
    return lifetime == "run" or (lifetime == "auto" and not shards_sample)


class RankGroup:
    """engines.workers.ranks PolicyRank actors in one process group on Ray (cluster.ray_address,
    an initialised Ray, or a local one started here and stopped by close)."""

    def __init__(self, workers: TrainWorkersConfig, threads: int | None, ray_address: str | None):
        self.timeout = workers.start_timeout_s
        self.ray, self.owns_ray = start_ray(ray_address, workers.ranks * workers.num_cpus_per_rank)
        self.ranks: list[Any] = []
        self.pids: list[int] = []
        self.nodes: list[str] = []
        try:
            self._start(workers, threads)
        except BaseException:
            self.close()  # no ranks or local Ray left behind by a failed start
            raise

    def _start(self, workers: TrainWorkersConfig, threads: int | None) -> None:
        cuda = workers.num_gpus_per_rank > 0
        env = {"OMP_NUM_THREADS": str(threads or 1), "DS_ACCELERATOR": "cuda" if cuda else "cpu"}
        actor = self.ray.remote(PolicyRank)
        started = time.perf_counter()
        self.ranks = [
            actor.options(
                num_cpus=workers.num_cpus_per_rank,
                num_gpus=workers.num_gpus_per_rank,
                name=None,
                runtime_env={"env_vars": env},
            ).remote(rank, workers.ranks, cuda, threads)
            for rank in range(workers.ranks)
        ]
        address, port = self.get(self.ranks[0].rendezvous.remote())
        backend = self.all(lambda r: r.join.remote(address, port))[0]
        self.pids = self.all(lambda r: r.pid.remote())
        self.nodes = self.all(lambda r: r.node.remote())
        log.info(
            "training ranks: %d Ray actors (pids %s) on %d node(s) in a %s group at %s:%d, "
            "up in %.1f s",
            len(self.ranks), self.pids, len(set(self.nodes)), backend, address, port,
            time.perf_counter() - started,
        )  # fmt: skip

    def get(self, ref: Any) -> Any:
        """ray.get within engines.workers.start_timeout_s, or a SettingError naming it."""
        try:
            return self.ray.get(ref, timeout=self.timeout)
        except self.ray.exceptions.GetTimeoutError as err:
            raise SettingError(
                f"training ranks: not ready within {self.timeout:.0f} s ({START_TIMEOUT_SETTING}); "
                "does the Ray cluster have the CPUs/GPUs engines.workers reserves per rank?"
            ) from err

    def all(self, call: Callable[[Any], Any]) -> list[Any]:
        """One call on every rank at once (collectives need them all), results in rank order."""
        return list(self.get([call(rank) for rank in self.ranks]))

    def close(self) -> None:
        if self.ray.is_initialized():  # else the ranks went with the Ray that stopped
            for rank in self.ranks:
                self.ray.kill(rank)
        self.ranks = []
        if self.owns_ray and self.ray.is_initialized():
            self.ray.shutdown()
            log.info("training ranks: local Ray stopped")


class RayWorkersUpdater:
    """The PolicyUpdater of engines.train_workers = ray for one GRPO stage, on a RankGroup (the
    run's, or one started for the stage and closed with it). The ranks load policy_k at the
    stage's first step. The stage's model holds no optimizer, gradients or reference; it gets
    rank 0's weights only when it samples or is saved (hand_on(None), weights()). Where the
    stage's sampling does not use it, the model is a skeleton on the meta device (no weights
    in the stage process at all): weights() and followers get rank 0's weights directly."""

    def __init__(
        self,
        group: RankGroup,
        engines: EnginesSection,
        grpo: GRPOStageSection,
        model: nn.Module,
        policy_dir: Path,
        policy_dtype: str,
        state_dir: str,
        owns_group: bool,
        sync_dir: Path | None = None,
        attn_implementation: str | None = None,
    ) -> None:
        """state_dir: the directory in a progress checkpoint that the ranks write the optimizer
        state to: DeepSpeed's own checkpoint (policy_updaters.DEEPSPEED_STATE, as for the
        in-process engine), or rank 0's file of a DDP group's state. owns_group:
        close() closes the group (its lifetime is the stage). sync_dir: where rank 0 writes
        each update for vLLM engines that reload it (engines.vllm.weight_sync = disk; in the
        store, which the ranks and the engines share); removed at close()."""
        self.group, self.owns_group = group, owns_group
        self.sync_dir = sync_dir
        self.syncs = 0  # rank 0's updates written to sync_dir: update-0, update-1, ...
        self.state_dir = state_dir
        self.engines, self.algo, self.model = engines, grpo.algo, model
        self.total_steps = grpo_total_steps(grpo)
        self.policy_dir, self.dtype = policy_dir, policy_dtype
        self.attn_implementation = attn_implementation  # policy.attn_implementation
        self.loaded = False
        self.model_stale = False  # rank 0 holds weights the stage's model lacks
        self.rank0_holds_weights = False  # rank 0 kept the ranks' weights (update or gather)
        self.source = RankWeights(self)
        self.stage_holds_weights = holds_weights(model)

    @property
    def ray(self) -> Any:
        return self.group.ray

    @property
    def ranks(self) -> list[Any]:
        """The group's actors, rank 0 first."""
        return self.group.ranks

    @property
    def pids(self) -> list[int]:
        return self.group.pids

    @property
    def nodes(self) -> list[str]:
        return self.group.nodes

    def _load(self, start_dir: Path) -> None:
        if self.loaded:
            return
        args = (self.engines, self.algo, self.total_steps, str(self.policy_dir), str(start_dir))
        attention = self.attn_implementation
        self.group.all(lambda r: r.load.remote(*args, self.dtype, attention))
        self.loaded = True

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        self._load(self.policy_dir)
        inputs = self.ray.put(update_tensors(batch, advantages, old_logprobs))  # stored once
        results = self.ray.get([rank.update.remote(inputs, seed) for rank in self.ranks])
        self.model_stale = self.rank0_holds_weights = True
        return dict(results[0])

    def hand_on(self, follower: RolloutEngine | None) -> None:
        """Rank 0 broadcasts the policy to a follower that takes it (vLLM, weight_sync =
        memory); any other gets it from the stage's model, which gets it from rank 0."""
        if isinstance(follower, TakesBroadcast) and follower.receive_broadcast(self.source):
            return
        if not self.stage_holds_weights:
            if follower is not None and self._engines_reload_from_disk():
                self._write_for_reload(follower)
            elif follower is not None:
                follower.receive_weights(self._rank0_weights())
            return
        self._sync_model()
        if follower is not None:
            follower.receive_weights(self.model.state_dict())

    def _engines_reload_from_disk(self) -> bool:
        engine = self.engines.rollout_capabilities(self.engines.grpo_rollout)
        return engine.reloads_updates and self.sync_dir is not None

    def _write_for_reload(self, follower: RolloutEngine) -> None:
        """Rank 0 writes the policy into a new directory that the engines reload (a new
        directory each time: an engine skips a reload of the directory it holds), so the
        weights never pass through the stage; the one before is removed once it is read."""
        assert self.sync_dir is not None
        start = time.perf_counter()
        self.gather_once()
        directory = self.sync_dir / f"update-{self.syncs}"
        shutil.rmtree(directory, ignore_errors=True)  # left by a killed attempt
        self.on_rank0("save_weights", str(directory))
        written = time.perf_counter()
        follower.load(directory)
        if self.syncs > 0:
            shutil.rmtree(self.sync_dir / f"update-{self.syncs - 1}", ignore_errors=True)
        self.syncs += 1
        log.info(
            "vLLM weight sync written by training rank 0: save %.3f s + reload %.3f s",
            written - start,
            time.perf_counter() - written,
        )

    def weights(self) -> dict[str, Tensor] | None:
        """Rank 0's weights where the stage's model is a skeleton; else None, once the stage's
        model holds them."""
        if not self.stage_holds_weights:
            return without_tied_copies(self.model, self._rank0_weights())
        self._sync_model()
        return None

    def save_weights(self, model: PreTrainedModel, directory: Path) -> None:
        """Rank 0 writes its weights itself into `directory` (the store the ranks load
        policy_k from, shared on a cluster) where the stage's model is a skeleton: they never
        reach the stage process."""
        if self.stage_holds_weights:
            self._sync_model()
            model.save_pretrained(directory, safe_serialization=True)
            return
        self.gather_once()
        self.on_rank0("save_weights", str(directory))

    def _rank0_weights(self) -> dict[str, Tensor]:
        self.gather_once()
        weights: dict[str, Tensor] = self.on_rank0("current_weights")
        return weights

    def on_rank0(self, method: str, *args: Any) -> Any:
        """Call one of rank 0's methods and wait for its result."""
        return self.group.get(getattr(self.ranks[0], method).remote(*args))

    def gather_once(self) -> None:
        """Rank 0 keeps the ranks' weights unless an update already left them there."""
        if not self.rank0_holds_weights:
            self._load(self.policy_dir)
            self.group.all(lambda r: r.gather.remote())
            self.rank0_holds_weights = True

    def _sync_model(self) -> None:
        if self.model_stale:
            with torch.no_grad():  # tied weights come once
                self.model.load_state_dict(self.on_rank0("current_weights"), strict=False)
            self.model_stale = False

    def save_state(self, directory: Path) -> None:
        """The ranks write the optimizer state into the checkpoint themselves (PolicyRank):
        nothing of it comes to the stage."""
        self._load(self.policy_dir)
        where = str(directory / self.state_dir)
        self.group.all(lambda r: r.save_state.remote(where))

    def load_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        self._load(directory)  # the ranks start from the checkpoint's weights
        self.rank0_holds_weights = False
        where = str(directory / self.state_dir)
        self.group.all(lambda r: r.load_state.remote(where, state))

    def close(self) -> None:
        """The stage's end: the group closes with it, or (kept for the run) lets go of the
        stage's engine and weights. Rank 0's updates written for the engines go."""
        if self.sync_dir is not None:
            shutil.rmtree(self.sync_dir, ignore_errors=True)
            with contextlib.suppress(OSError):  # its role directory, unless another holds it
                self.sync_dir.parent.rmdir()
        if self.owns_group:
            self.group.close()
            return
        try:
            if self.group.ranks:
                self.group.all(lambda r: r.release.remote())
        except Exception:  # a rank died (its error is the stage's): the run starts new ones
            log.warning("training ranks: releasing the stage failed; stopping the ranks")
            self.group.close()


def train_reward_model_on_ranks(
    group: RankGroup | None,
    engines: EnginesSection,
    threads: int | None,
    ray_address: str | None,
    model: RewardModel,
    examples: TrainingMix,
    rm_cfg: RewardModelConfig,
    seed: int,
    start_dir: Path,
    saved: bool = False,
) -> tuple[dict[str, float], list[TrainedRow], dict[str, Tensor]]:
    """train_reward_model of `model` on the training ranks (engines.workers.reward_models):
    `group`, the run's, or one started for this and closed after. The ranks load the model
    from start_dir in the store (saved: it is there already, RM_{k-1}'s checkpoint, left as it
    is; else written here and removed after) and read the examples from Ray's object store;
    rank 0's metrics, trained rows and whole weights."""
    ranks = RankGroup(engines.workers, threads, ray_address) if group is None else group
    started = time.perf_counter()
    try:
        if not saved:
            model.save(start_dir)
        shared = ranks.ray.put(list(examples))  # stored once, read by every rank
        args = (str(start_dir), shared, rm_cfg, engines, seed)
        results = ranks.all(lambda r: r.train_reward_model.remote(*args))
    finally:
        if not saved:  # its role directory too, which holds nothing else
            shutil.rmtree(start_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                start_dir.parent.rmdir()
        if group is None:
            ranks.close()
    metrics, records, weights = results[0]
    log.info(
        "%s trained on %d Ray ranks in %.1f s",
        model.kind.upper(),
        len(results),
        time.perf_counter() - started,
    )
    return metrics, records, weights
