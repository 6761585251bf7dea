"""Long-lived training ranks (engines.train_workers = ray): the GRPO update on Ray actors that
live for the whole GRPO stage, each one rank of a torch.distributed group (gloo on CPU,
NCCL on GPU) running DeepSpeedEngine (engines.train = deepspeed) or the torch engine under
DDP (engines.train = torch). Each step's batch and advantages go to the ranks once through
Ray's object store. Rank 0 keeps its updated weights: it broadcasts them itself to the vLLM
engines' workers (one gloo/NCCL group, `RankWeights`), and sends them back to the stage only
when the stage's model needs them (it samples with that model, or saves a checkpoint). The
ranks write and read the optimizer state of the stage's progress checkpoints themselves.
Why actors and not launcher jobs, and how it runs on a cluster: docs/train_workers.md.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from flows.config import EnginesSection, GRPOStageSection
from flows.engines.ray_runtime import start_ray
from flows.engines.train_engines import grpo_total_steps
from flows.progress import log
from grpo_core.algo.config import GRPOConfig
from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.policy_batch import PolicyBatch, update_inputs, update_tensors
from grpo_core.contracts.registry import Registry
from grpo_core.contracts.rollout import RolloutEngine
from grpo_core.contracts.training import OptimizerSettings, TrainEngine
from grpo_core.engines.config import TrainWorkersConfig
from grpo_core.engines.sharded_rollout import TakesBroadcast
from grpo_core.engines.weight_sync import WeightSender, manifest, unique_tensors

START_TIMEOUT_SETTING = "engines.workers.start_timeout_s"

# engines.train -> the engine one rank of the group runs, built on the rank's model once the
# default process group is up: (model, optimizer settings, engines section) -> TrainEngine.
RankEngineBuilder = Callable[[nn.Module, OptimizerSettings, EnginesSection], TrainEngine]
RANK_ENGINES: Registry[RankEngineBuilder] = Registry("training-rank engine")


def _deepspeed_rank(model: nn.Module, optim: OptimizerSettings, engines: EnginesSection) -> Any:
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(model, optim, engines.deepspeed)


def _torch_rank(model: nn.Module, optim: OptimizerSettings, engines: EnginesSection) -> Any:
    from grpo_core.engines.ddp_engine import DistributedTorchEngine

    return DistributedTorchEngine(model, optim)


RANK_ENGINES.add("deepspeed", _deepspeed_rank)
RANK_ENGINES.add("torch", _torch_rank)


def free_port(host: str) -> int:
    """A TCP port free on `host` now (the group's rendezvous port)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PolicyRank:
    """One training rank (the body of a Ray actor): joins the group, loads the policy (and the
    reference when beta > 0) once, then runs grpo_update on every step's batch."""

    def __init__(self, rank: int, world: int, cuda: bool, threads: int | None) -> None:
        self.rank, self.world, self.cuda = rank, world, cuda
        if threads:
            torch.set_num_threads(threads)
        self.engine: TrainEngine | None = None
        self.model: nn.Module | None = None
        self.reference: nn.Module | None = None
        self.algo = GRPOConfig()
        self.weights: dict[str, Tensor] | None = None  # rank 0: the policy after the last update
        self.sender: WeightSender | None = None  # rank 0: its sync group with vLLM workers

    def pid(self) -> int:
        """This rank's process id (a test checks that no step starts a process)."""
        return os.getpid()

    def node(self) -> str:
        """The Ray node this rank runs on (a test checks the placement)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: the address and a free port of this node, where the group meets."""
        import ray

        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    def join(self, address: str, port: int) -> str:
        """Join the default torch.distributed group (all ranks at once); the backend."""
        from grpo_core.engines.ddp_engine import init_process_group

        # DeepSpeed reads these (ZeRO-3 reads LOCAL_RANK while training); Ray shows a GPU rank
        # only its own GPU, so the local rank is 0 on every node.
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK="0",
            MASTER_ADDR=address,
            MASTER_PORT=str(port),
        )
        return init_process_group(self.rank, self.world, address, port, self.cuda)

    def load(
        self,
        engines: EnginesSection,
        algo: GRPOConfig,
        total_steps: int,
        policy_dir: str,
        start_dir: str,
        dtype: str,
    ) -> None:
        """The engine on the policy saved at start_dir (policy_k, or a progress checkpoint's
        weights on resume); the frozen reference from policy_dir when beta > 0."""
        from grpo_core.model.policy import load_policy

        self.algo = algo
        device = torch.device("cuda" if self.cuda else "cpu")
        model = _in_torch_memory(load_policy(start_dir, dtype)[0]).to(device)
        self.model = model
        optim = algo.optimizer_settings(total_steps)
        self.engine = RANK_ENGINES[engines.train](model, optim, engines)
        if algo.beta > 0:
            ds = engines.deepspeed
            ref_dtype = "bfloat16" if engines.train == "deepspeed" and ds.bf16 else dtype
            reference = _in_torch_memory(load_policy(policy_dir, ref_dtype)[0])
            self.reference = reference.to(self.engine.device).eval().requires_grad_(False)

    def update(self, inputs: dict[str, Tensor], seed: int) -> dict[str, float]:
        """grpo_update on this rank's share of the batch; its metrics. Rank 0 keeps the whole
        updated weights (collective to gather under ZeRO-3: every rank takes part)."""
        from grpo_core.algo.update import grpo_update

        engine = self._engine()
        batch, advantages, old_logprobs = update_inputs(inputs, engine.device)
        metrics = grpo_update(
            engine,
            self.reference,
            batch,
            advantages,
            self.algo,
            old_logprobs=old_logprobs,
            generator=torch.Generator().manual_seed(seed),
        )
        self.gather()
        return metrics

    def gather(self) -> None:
        """Rank 0 keeps the whole weights of the engine (every rank calls this at once)."""
        weights = self._engine().full_state_dict()
        if self.rank == 0:
            self.weights = {name: value.detach().cpu() for name, value in weights.items()}

    def current_weights(self) -> dict[str, Tensor]:
        """Rank 0: the weights of the last update or load (for the stage's model)."""
        if self.weights is None:
            raise RuntimeError("training rank 0 asked for weights before any update or gather")
        return self.weights

    def open_sync(self, world_size: int, timeout_s: float) -> tuple[str, int, str]:
        """Rank 0: a store on this node for the weight-sync group with world_size - 1 vLLM
        workers; (host, port, backend): NCCL when this rank trains on a GPU, else gloo."""
        import ray

        host = ray.util.get_node_ip_address()
        self.sender = WeightSender(timeout_s, host=host, world_size=world_size)
        return host, self.sender.port, "nccl" if self.cuda else "gloo"

    def connect_sync(self, backend: str) -> None:
        """Rank 0 joins the sync group (the workers join at the same time)."""
        self._sender().connect(backend)

    def sync_manifest(self) -> list[list[object]]:
        """What broadcast_weights sends, in order (tied tensors once)."""
        return manifest(unique_tensors(self.current_weights()))

    def broadcast_weights(self) -> int:
        """Rank 0 broadcasts its weights over the sync group; the bytes sent."""
        return self._sender().send(unique_tensors(self.current_weights()))

    def _sender(self) -> WeightSender:
        if self.sender is None:
            raise RuntimeError("training rank 0 has no weight-sync group: call open_sync first")
        return self.sender

    def save_state(self, directory: str) -> dict[str, Any] | None:
        """Every rank writes its part of the optimizer state into directory (DeepSpeed's
        sharded checkpoint), or returns it whole (one rank, or DDP: the same on all ranks)."""
        return self._engine().save_optimizer_state(Path(directory))

    def load_state(self, directory: str, state: dict[str, Any] | None) -> None:
        """Restore what save_state wrote (the engine was loaded from the same checkpoint)."""
        self._engine().load_optimizer_state(Path(directory), state)

    def _engine(self) -> TrainEngine:
        if self.engine is None:
            raise RuntimeError("training rank used before load()")
        return self.engine


class RankWeights:
    """The WeightSource of training rank 0 (an actor), as the stage's rollout engine sees it:
    the vLLM workers join rank 0's group and receive its broadcast, while the stage process
    only passes the calls on."""

    def __init__(self, updater: RayWorkersUpdater) -> None:
        self.updater = updater
        self.backend = ""

    def open_sync(self, world_size: int, timeout_s: float) -> tuple[str, int, str]:
        host, port, self.backend = self.updater.on_rank0("open_sync", world_size, timeout_s)
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


def _in_torch_memory(model: nn.Module) -> nn.Module:
    """The weights copied out of the checkpoint's memory map into torch memory: CPU matmuls
    round with the weights' alignment (docs/ray_shards.md), and a resumed rank loads from a
    checkpoint what an uninterrupted rank holds in torch memory."""
    with torch.no_grad():
        for param in model.parameters():  # a tied weight is one Parameter: copied once
            param.data = param.data.clone()
    return model


class RayWorkersUpdater:
    """The PolicyUpdater of engines.train_workers = ray: engines.workers.ranks PolicyRank
    actors for the whole stage. The stage's model holds no optimizer, gradients or reference;
    it gets rank 0's weights only when it samples or is saved (hand_on(None), weights())."""

    def __init__(
        self,
        engines: EnginesSection,
        grpo: GRPOStageSection,
        threads: int | None,
        model: nn.Module,
        policy_dir: Path,
        policy_dtype: str,
        ray_address: str | None,
        state_dir: str,
    ) -> None:
        """state_dir: the directory in a progress checkpoint that DeepSpeed's own checkpoint
        goes to (policy_updaters.DEEPSPEED_STATE, as for the in-process engine)."""
        workers = engines.workers
        self.state_dir = state_dir
        self.engines, self.algo, self.model = engines, grpo.algo, model
        self.total_steps = grpo_total_steps(grpo)
        self.policy_dir, self.dtype = policy_dir, policy_dtype
        self.timeout = workers.start_timeout_s
        self.ray, self.owns_ray = start_ray(ray_address, workers.ranks * workers.num_cpus_per_rank)
        self.ranks: list[Any] = []
        self.pids: list[int] = []
        self.nodes: list[str] = []
        self.loaded = False
        self.model_stale = False  # rank 0 holds weights the stage's model lacks
        self.rank0_holds_weights = False  # rank 0 kept the ranks' weights (update or gather)
        self.source = RankWeights(self)
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
        address, port = self._get(self.ranks[0].rendezvous.remote())
        backend = self._all(lambda r: r.join.remote(address, port))[0]
        self.pids = self._all(lambda r: r.pid.remote())
        self.nodes = self._all(lambda r: r.node.remote())
        log.info(
            "training ranks: %d Ray actors (pids %s) on %d node(s) in a %s group at %s:%d, "
            "up in %.1f s",
            len(self.ranks), self.pids, len(set(self.nodes)), backend, address, port,
            time.perf_counter() - started,
        )  # fmt: skip

    def _get(self, ref: Any) -> Any:
        try:
            return self.ray.get(ref, timeout=self.timeout)
        except self.ray.exceptions.GetTimeoutError as err:
            raise SettingError(
                f"training ranks: not ready within {self.timeout:.0f} s ({START_TIMEOUT_SETTING}); "
                "does the Ray cluster have the CPUs/GPUs engines.workers reserves per rank?"
            ) from err

    def _all(self, call: Callable[[Any], Any]) -> list[Any]:
        """One call on every rank at once (collectives need them all), results in rank order."""
        return list(self._get([call(rank) for rank in self.ranks]))

    def _load(self, start_dir: Path) -> None:
        if self.loaded:
            return
        args = (self.engines, self.algo, self.total_steps, str(self.policy_dir), str(start_dir))
        self._all(lambda r: r.load.remote(*args, self.dtype))
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
        self._sync_model()
        if follower is not None:
            follower.receive_weights(self.model.state_dict())

    def weights(self) -> dict[str, Tensor] | None:
        self._sync_model()
        return None  # the stage's model holds rank 0's last weights

    def on_rank0(self, method: str, *args: Any) -> Any:
        """Call one of rank 0's methods and wait for its result."""
        return self._get(getattr(self.ranks[0], method).remote(*args))

    def gather_once(self) -> None:
        """Rank 0 keeps the ranks' weights unless an update already left them there."""
        if not self.rank0_holds_weights:
            self._load(self.policy_dir)
            self._all(lambda r: r.gather.remote())
            self.rank0_holds_weights = True

    def _sync_model(self) -> None:
        if self.model_stale:
            with torch.no_grad():  # tied weights come once
                self.model.load_state_dict(self.on_rank0("current_weights"), strict=False)
            self.model_stale = False

    def save_state(self, directory: Path) -> dict[str, Any] | None:
        self._load(self.policy_dir)
        where = str(directory / self.state_dir)
        state: dict[str, Any] | None = self._all(lambda r: r.save_state.remote(where))[0]
        return state

    def load_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        self._load(directory)  # the ranks start from the checkpoint's weights
        self.rank0_holds_weights = False
        where = str(directory / self.state_dir)
        self._all(lambda r: r.load_state.remote(where, state))

    def close(self) -> None:
        for rank in self.ranks:
            self.ray.kill(rank)
        self.ranks = []
        if self.owns_ray:
            self.ray.shutdown()
            log.info("training ranks: local Ray stopped")
