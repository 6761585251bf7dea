"""The body of one long-lived training rank (engines.train_workers = ray): a Ray actor that
joins the ranks' torch.distributed group (gloo on CPU, NCCL on GPU), loads the policy (and
the reference) at each GRPO stage's start, and runs grpo_update on each step's batch with
the engine of engines.train (DeepSpeedEngine, or the torch engine under DDP). Rank 0 keeps
the updated weights and broadcasts them to the vLLM engines' workers itself. The group that
drives the actors: flows/engines/train_workers.py.
"""

from __future__ import annotations

import gc
import io
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from flows.engines_config import EnginesSection
from grpo_core.algo.config import GRPOConfig
from grpo_core.contracts.policy_batch import update_inputs
from grpo_core.contracts.registry import Registry
from grpo_core.contracts.training import OptimizerSettings, TrainEngine
from grpo_core.engines.train import OPTIMIZER_STATE_FILE, with_policy_precision
from grpo_core.engines.weight_sync import WeightSender, manifest, sync_backend, unique_tensors
from storage.atomic import atomic_write_bytes

if TYPE_CHECKING:
    from reward_models.config import RewardModelConfig
    from reward_models.pairwise import TrainingMix
    from reward_models.training import TrainedRow

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
    reference when the loss reads it) once, then runs grpo_update on every step's batch."""

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
        self.collective_gather = False  # ZeRO-3: every rank takes part in gathering the weights

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
        attn_implementation: str | None = None,
    ) -> None:
        """The engine on the policy saved at start_dir (policy_k, or a progress checkpoint's
        weights on resume); the frozen reference from policy_dir when the loss reads it; both
        with policy.attn_implementation. A rank kept for the run loads again at each GRPO
        stage: what the last stage held goes first (a new optimizer each iteration, as in one
        process)."""
        from grpo_core.model.policy import load_policy

        self.release()
        self.algo = algo
        self.collective_gather = engines.train == "deepspeed" and engines.deepspeed.zero_stage == 3
        device = torch.device("cuda" if self.cuda else "cpu")
        loaded = load_policy(start_dir, dtype, attn_implementation=attn_implementation)[0]
        model = _in_torch_memory(loaded).to(device)
        self.model = model
        optim = with_policy_precision(algo.optimizer_settings(total_steps), dtype)
        self.engine = RANK_ENGINES[engines.train](model, optim, engines)
        if algo.loss_reads_reference:
            ds = engines.deepspeed
            ref_dtype = "bfloat16" if engines.train == "deepspeed" and ds.bf16 else dtype
            frozen = load_policy(policy_dir, ref_dtype, attn_implementation=attn_implementation)
            reference = _in_torch_memory(frozen[0])
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
        """Rank 0 keeps the whole weights of the engine (every rank calls this at once; only
        under ZeRO-3 do the others have a part to give, else they return at once)."""
        if self.rank != 0 and not self.collective_gather:
            return
        weights = self._engine().full_state_dict()
        if self.rank == 0:
            self.weights = {name: value.detach().cpu() for name, value in weights.items()}

    def current_weights(self) -> dict[str, Tensor]:
        """Rank 0: the weights of the last update or load (for the stage's model)."""
        if self.weights is None:
            raise RuntimeError("training rank 0 asked for weights before any update or gather")
        return self.weights

    def train_reward_model(
        self,
        start_dir: str,
        examples: TrainingMix,
        rm_cfg: RewardModelConfig,
        engines: EnginesSection,
        seed: int,
    ) -> tuple[dict[str, float], list[TrainedRow], dict[str, Tensor]] | None:
        """train_reward_model on this rank's share of every mini-batch of `examples`, from the
        reward model saved at start_dir (reward_models.RewardModelConfig `rm_cfg`); rank 0
        returns the metrics, the trained rows and the whole weights, the others None. What a
        GRPO stage held goes first; the trained model goes when this returns."""
        from reward_models.models import RewardModel
        from reward_models.training import rm_optimizer_settings, train_reward_model

        self.release()
        device = torch.device("cuda" if self.cuda else "cpu")
        model = _in_torch_memory(RewardModel.load(start_dir, dtype=rm_cfg.dtype)).to(device)
        assert isinstance(model, RewardModel)
        engine = RANK_ENGINES[engines.train](model, rm_optimizer_settings(rm_cfg), engines)
        metrics, records = train_reward_model(
            model, examples, rm_cfg, seed, progress=False, engine=engine
        )
        weights = engine.full_state_dict()  # collective under ZeRO-3
        result = None
        if self.rank == 0:
            result = (metrics, records, {n: t.detach().cpu() for n, t in weights.items()})
        del engine, model, weights
        self.release()
        return result

    def save_weights(self, directory: str) -> None:
        """Rank 0: the weights of the last update or load as an HF checkpoint's weights and
        config in `directory`, through this rank's model (a tied head once)."""
        from grpo_core.model.policy import without_tied_copies

        assert self.model is not None, "save_weights before load"
        model = cast(PreTrainedModel, self.model)
        weights = without_tied_copies(model, self.current_weights())
        model.save_pretrained(directory, safe_serialization=True, state_dict=weights)

    def open_sync(self, world_size: int, timeout_s: float, backend: str) -> tuple[str, int, str]:
        """Rank 0: a store on this node for the weight-sync group with world_size - 1 vLLM
        workers; (host, port, backend): `backend`, the engines' setting, with auto NCCL when
        this rank trains on a GPU of its own (Ray reserved it), else gloo."""
        import ray

        host = ray.util.get_node_ip_address()
        self.sender = WeightSender(timeout_s, host=host, world_size=world_size)
        device = torch.device("cuda" if self.cuda else "cpu")
        return host, self.sender.port, sync_backend(backend, device, sender_owns_gpu=self.cuda)

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

    def save_state(self, directory: str) -> None:
        """Every rank writes its part of the optimizer state into directory (DeepSpeed's
        sharded checkpoint); an engine that gives it whole (DDP: the same on every rank) has
        rank 0 write it there, so that AdamW's moments (twice the weights) never travel to
        the stage process, one copy per rank, as they did."""
        state = self._engine().save_optimizer_state(Path(directory))
        if state is not None and self.rank == 0:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            Path(directory).mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(Path(directory) / OPTIMIZER_STATE_FILE, buffer.getvalue())

    def load_state(self, directory: str, state: dict[str, Any] | None) -> None:
        """Restore what save_state wrote (the engine was loaded from the same checkpoint; it
        reads rank 0's file when `state` is None); a state given here (a checkpoint from before
        rank 0 wrote it) comes first."""
        self._engine().load_optimizer_state(Path(directory), state)

    def release(self) -> None:
        """Drop the stage's engine, model, reference and kept weights (the group stays)."""
        self.engine = self.model = self.reference = None
        self.weights = None
        gc.collect()  # DeepSpeed's engine holds reference cycles; free its memory now
        if self.cuda:
            torch.cuda.empty_cache()

    def _engine(self) -> TrainEngine:
        if self.engine is None:
            raise RuntimeError("training rank used before load()")
        return self.engine


def _in_torch_memory(model: nn.Module) -> nn.Module:
    """The weights copied out of the checkpoint's memory map into torch memory: CPU matmuls
    round with the weights' alignment (docs/ray_shards.md), and a resumed rank loads from a
    checkpoint what an uninterrupted rank holds in torch memory."""
    with torch.no_grad():
        for param in model.parameters():  # a tied weight is one Parameter: copied once
            param.data = param.data.clone()
    return model
