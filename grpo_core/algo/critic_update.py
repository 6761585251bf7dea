"""PPO's critic in a GRPO stage: before the policy update, its values and the KL terms of a
batch (what the `ppo` estimator reads); after it, mu epochs of clipped value-loss steps on
the same batch on the critic's own training engine (torch or DeepSpeed, its own AdamW), and
the adaptive KL coefficient's update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from grpo_core.algo.advantages import PPOTerms
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.micro_batches import (
    note_rows_over_budget,
    plan_micro_batches,
    planned_logprobs,
    row_lengths,
    trimmed_forward,
)
from grpo_core.algo.ppo import (
    adaptive_kl_coef,
    clipped_value_loss,
    explained_variance,
    ppo_targets,
    sequence_kl,
    token_kl,
)
from grpo_core.contracts.numerics import DIVERGED, require_finite
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.training import OptimizerSettings, TrainEngine
from grpo_core.model.checkpointing import set_gradient_checkpointing
from grpo_core.model.critic import ValueModel
from grpo_core.model.forward import sequence_logprobs
from grpo_core.model.packing import packs


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def critic_optimizer_settings(algo: GRPOConfig) -> OptimizerSettings:
    """The critic's AdamW: grpo.algo.ppo.critic_lr at a constant rate, the policy's betas,
    weight decay and gradient clipping."""
    return OptimizerSettings(
        lr=algo.ppo.critic_lr,
        weight_decay=algo.weight_decay,
        betas=(algo.adam_beta1, algo.adam_beta2),
        max_grad_norm=algo.max_grad_norm,
    )


class CriticLearner:
    """The critic on its training engine (built on it with critic_optimizer_settings) and the
    KL coefficient of one GRPO stage; `policy` is the model the stage updates in place
    (pi_old before each update), `reference` pi_ref (None: no KL penalty in the reward)."""

    def __init__(
        self,
        critic: ValueModel,
        engine: TrainEngine,
        policy: nn.Module,
        reference: nn.Module | None,
        algo: GRPOConfig,
    ) -> None:
        self.critic, self.engine = critic, engine
        self.policy, self.reference, self.algo = policy, reference, algo
        self.kl_coef = algo.ppo.kl_coef
        self.packed = packs(engine.model, algo.padding_free, "critic")

    def _values(self, batch: PolicyBatch) -> Tensor:
        """The critic's (B, L) values of a batch on the engine's device (through the engine:
        DeepSpeed gathers what it has partitioned), at its precision (policy.dtype's autocast),
        packed into one row under padding_free."""
        with self.engine.forward_context():
            values: Tensor = (
                self.engine.model(batch, packed=True) if self.packed else self.engine.model(batch)
            )
        return values

    def _micro_values(self, part: PolicyBatch) -> Tensor:
        """_values of one micro-batch: under a token budget, on its own columns only."""
        if self.algo.max_tokens_per_micro_batch is None or self.packed:
            return self._values(part)
        return trimmed_forward(self._values, part)

    def _micro_batches(self, rows: Tensor, lengths: list[int]) -> list[Tensor]:
        """`rows` (indices; `lengths` gives each one's tokens) as the policy's micro-batches:
        micro_batch_size rows, or cut by max_tokens_per_micro_batch."""
        budget = self.algo.max_tokens_per_micro_batch
        if budget is None:
            return list(torch.split(rows, self.algo.micro_batch_size))
        note_rows_over_budget([lengths[r] for r in rows.tolist()], budget)
        plan = plan_micro_batches([lengths[r] for r in rows.tolist()], budget, self.packed)
        return [rows[torch.tensor(at, dtype=torch.long, device=rows.device)] for at in plan]

    def _logprobs(self, model: nn.Module, batch: PolicyBatch, role: str) -> Tensor:
        part = batch.to(_device(model))
        algo = self.algo
        packed = packs(model, algo.padding_free, role)
        if algo.max_tokens_per_micro_batch is None:
            logp = sequence_logprobs(
                model, part, algo.temperature, algo.micro_batch_size, packed=packed
            )
        else:
            logp = planned_logprobs(
                model, part, algo.temperature, algo.max_tokens_per_micro_batch, packed=packed
            )
        return logp.cpu()

    @torch.no_grad()
    def prepare(self, batch: PolicyBatch) -> PPOTerms:
        """Values and log(pi_old / pi_ref) of a CPU batch, in response coordinates."""
        self.engine.eval()
        values = torch.zeros_like(batch.response_mask)
        for rows in self._micro_batches(torch.arange(len(batch)), row_lengths(batch)):
            values[rows] = self._micro_values(batch.select(rows).to(self.engine.device)).cpu()
        log_ratio = torch.zeros_like(batch.response_mask)
        if self.reference is not None and self.kl_coef > 0:
            with self.engine.forward_context():  # the critic's engine has the policy's
                old = self._logprobs(self.policy, batch, "policy")
                reference = self._logprobs(self.reference, batch, "reference model")
                log_ratio = (old - reference) * batch.response_mask
        ppo = self.algo.ppo
        return PPOTerms(
            values=batch.full_to_response(values),
            log_ratio=batch.full_to_response(log_ratio),
            kl_coef=self.kl_coef,
            gamma=ppo.gamma,
            lam=ppo.lam,
            whiten=ppo.whiten_advantages,
        )

    def update(
        self, batch: PolicyBatch, terms: PPOTerms, scores: Tensor, seed: int
    ) -> dict[str, float]:
        """mu epochs of the clipped value loss towards the returns of `terms` and the (B,)
        scalar rewards `scores`, mini-batches shuffled with `seed`; the step's critic metrics."""
        algo, ppo = self.algo, self.algo.ppo
        mask = batch.full_to_response(batch.response_mask)
        targets = ppo_targets(terms, scores, mask)
        dev = self.engine.device
        rows = batch.to(dev)
        returns = batch.response_to_full(targets.returns).to(dev)
        old_values = batch.response_to_full(terms.values).to(dev)
        generator = torch.Generator().manual_seed(seed)
        self.engine.zero_grad()
        self.engine.train()
        set_gradient_checkpointing(self.engine.model, ppo.critic_gradient_checkpointing)
        loss_total = clipped_total = grad_norm_total = 0.0
        steps = 0
        lengths = row_lengths(batch)
        for _ in range(algo.mu):
            order = torch.randperm(len(batch), generator=generator).to(dev)
            for mini in torch.tensor_split(order, algo.mini_batches_per_epoch):
                tokens = rows.response_mask[mini].sum().clamp(min=1.0)
                for micro in self._micro_batches(mini, lengths):
                    part = rows.select(micro)
                    loss, clipped = clipped_value_loss(
                        self._micro_values(part),
                        old_values[micro],
                        returns[micro],
                        part.response_mask,
                        ppo.vf_clip,
                        tokens,
                    )
                    require_finite(
                        "critic value loss", loss, where="the critic update", cause=DIVERGED
                    )
                    self.engine.backward(ppo.vf_coef * loss)
                    loss_total += float(loss.detach())
                    clipped_total += float(clipped)
                grad_norm_total += self.engine.step()  # clip, AdamW step, clear gradients
                steps += 1
        self.engine.eval()
        current_kl = sequence_kl(terms.log_ratio, mask)
        count = mask.sum().clamp(min=1.0)
        metrics = {
            "value_loss": loss_total / steps,
            "value_clipfrac": clipped_total / steps,
            "value_grad_norm": grad_norm_total / steps,
            "value_mean": float((terms.values * mask).sum() / count),
            "returns_mean": float((targets.returns * mask).sum() / count),
            "kl_coef": terms.kl_coef,
            "reward_kl": current_kl,
        }
        if self.reference is not None and terms.kl_coef > 0 and algo.beta == 0:
            # the KL this step applied, as a penalty in the reward (with a KL term in the loss
            # as well, grpo.algo.beta > 0, the step's `kl` is the loss's)
            metrics["kl"] = token_kl(terms.log_ratio, mask)
        variance_explained = explained_variance(terms.values, targets.returns, mask)
        if variance_explained == variance_explained:  # undefined (NaN) when returns are equal
            metrics["explained_variance"] = variance_explained
        if ppo.kl_ctl == "adaptive":
            self.kl_coef = adaptive_kl_coef(
                self.kl_coef, current_kl, ppo.target_kl, ppo.horizon, len(batch)
            )
        return metrics

    def weights(self) -> dict[str, Tensor]:
        """The trained critic's whole weights (keys of ValueModel.state_dict())."""
        return self.engine.full_state_dict()

    def save_state(self, directory: Path) -> dict[str, Any]:
        """What resumes the critic's training besides its weights: the engine's optimizer
        state (DeepSpeed may write its own checkpoint into `directory`) and the KL coef."""
        return {"engine": self.engine.save_optimizer_state(directory), "kl_coef": self.kl_coef}

    def load_state(self, directory: Path, state: dict[str, Any]) -> None:
        """Resume from what save_state gave (the weights are loaded already)."""
        self.engine.load_optimizer_state(directory, state["engine"])
        self.kl_coef = float(state["kl_coef"])
