"""GRPO update settings (pydantic, shown as a Prefect form); the named presets that set
several of them at once are flows/grpo_presets.py's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpo_core.algo.dpo_config import DPOConfig
from grpo_core.algo.estimators import ADVANTAGE_ESTIMATORS, EstimatorSpec
from grpo_core.algo.importance_config import ImportanceSampling, RolloutCorrection
from grpo_core.algo.ppo_config import PPOConfig
from grpo_core.contracts.training import LRSchedule, OptimizerSettings

KLEstimator = Literal["k1", "k2", "k3"]
LossAgg = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
# advantages.ProcessCredit's choices, spelt out here: the config loads without torch
ProcessCredit = Literal["sum", "min"]


class GRPOConfig(BaseModel):
    """Hyper-parameters of one GRPO policy update (docs/algorithm.md sections 1-6, 10-12)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    beta: float = Field(
        default=0.04,
        ge=0.0,
        le=10.0,
        description="KL penalty weight in the loss, from 0 to 10 (paper: 0.04). "
        "0 skips the reference model entirely.",
    )
    kl_estimator: KLEstimator = Field(
        default="k3",
        description="KL estimator: 'k3' (paper, unbiased and non-negative), 'k1' (log ratio) "
        "or 'k2' (half squared log ratio).",
    )
    eps_low: float = Field(
        default=0.2,
        gt=0.0,
        lt=1.0,
        description="Lower clip range of the token ratio: ratios below 1 - eps_low are "
        "clipped; more than 0 and less than 1 (paper: 0.2). importance_sampling sequence "
        "clips with sequence_eps_low instead.",
    )
    eps_high: float = Field(
        default=0.2,
        gt=0.0,
        le=10.0,
        description="Upper clip range of the token ratio: ratios above 1 + eps_high are "
        "clipped; more than 0, at most 10 (paper: 0.2, DAPO clip-higher: 0.28). "
        "importance_sampling sequence clips with sequence_eps_high instead.",
    )
    importance_sampling: ImportanceSampling = Field(
        default="token",
        description="Level of the policy ratio pi_theta / pi_old in the clipped surrogate: "
        "'token' (PPO/GRPO, each token its own ratio, clipped by eps_low / eps_high), "
        "'sequence' (GSPO, Zheng et al. 2025: exp of the mean log-ratio over the output's "
        "response tokens, on every token of the output, clipped by sequence_eps_low / "
        "sequence_eps_high; TRL importance_sampling_level) or 'sequence_token' (GSPO-token: "
        "the sequence ratio's value with each token's own gradient, for per-token advantages). "
        "Off-policy only (mu > 1 or several mini-batches) do the levels' values differ.",
    )
    sequence_eps_low: float = Field(
        default=3e-4,
        gt=0.0,
        lt=1.0,
        description="Lower clip range of the sequence ratio (importance_sampling sequence or "
        "sequence_token): ratios below 1 - sequence_eps_low are clipped; more than 0 and less "
        "than 1 (GSPO paper: 3e-4).",
    )
    sequence_eps_high: float = Field(
        default=4e-4,
        gt=0.0,
        le=10.0,
        description="Upper clip range of the sequence ratio (importance_sampling sequence or "
        "sequence_token): ratios above 1 + sequence_eps_high are clipped; more than 0, at most "
        "10 (GSPO paper: 4e-4).",
    )
    rollout_correction: RolloutCorrection = Field(
        default_factory=RolloutCorrection,
        description="Correct the mismatch between the sampler's and the trainer's log-probs: "
        "weights pi_old / pi_sampler (truncated or masked, per token or per output) on the "
        "policy-gradient term; docs/algorithm.md section 11.",
    )
    loss_agg: LossAgg = Field(
        default="seq-mean-token-mean",
        description="Loss aggregation: 'seq-mean-token-mean' (paper, mean over tokens then "
        "sequences), 'token-mean' (DAPO, mean over all response tokens) or "
        "'seq-mean-token-sum-norm' (Dr. GRPO, token sum over the constant max_len_norm).",
    )
    adv_estimator: str = Field(
        default="grpo_outcome",
        description="How rewards become advantages (grpo_core/algo/advantages.py): "
        + "; ".join(f"'{name}' ({spec.summary})" for name, spec in ADVANTAGE_ESTIMATORS.items())
        + ".",
        json_schema_extra=ADVANTAGE_ESTIMATORS.json_schema,
    )
    adv_eps: float = Field(
        default=1e-4,
        gt=0.0,
        le=1.0,
        description="Added to the group std before dividing; more than 0, at most 1 (paper: 1e-4).",
    )
    mu: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Inner epochs over each rollout batch, 1 to 64 (paper: 1).",
    )
    lr: float = Field(
        default=1e-6,
        gt=0.0,
        le=1.0,
        description="Policy learning rate (AdamW), more than 0, at most 1 (paper: 1e-6).",
    )
    weight_decay: float = Field(
        default=0.0, ge=0.0, le=1.0, description="AdamW weight decay, from 0 to 1."
    )
    adam_beta1: float = Field(
        default=0.9, ge=0.0, lt=1.0, description="AdamW beta1, from 0 up to (not including) 1."
    )
    adam_beta2: float = Field(
        default=0.999, ge=0.0, lt=1.0, description="AdamW beta2, from 0 up to (not including) 1."
    )
    max_grad_norm: float = Field(
        default=1.0,
        gt=0.0,
        le=1e6,
        description="Gradient-norm clipping threshold, more than 0, at most 1e6 (paper: 1.0).",
    )
    micro_batch_size: int = Field(
        default=8,
        ge=1,
        le=65536,
        description="Rows per forward/backward pass (gradient accumulation), 1 to 65536. "
        "Changes memory use only, never the gradient.",
    )
    max_tokens_per_micro_batch: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="Token budget per forward/backward pass, replacing micro_batch_size "
        "(verl: use_dynamic_bsz with ppo_max_token_len_per_gpu): rows sorted by length are "
        "packed so rows x the micro-batch's longest row (prompt + completion tokens) stays "
        "within it, each micro-batch padded only to its own longest row; a longer row runs "
        "alone. Applies to the policy update, its pi_old / reference forwards and PPO's "
        "critic. Changes memory use and padding only, never the gradient. null: "
        "micro_batch_size rows per pass.",
    )
    padding_free: bool = Field(
        default=False,
        description="Run each micro-batch's rows as one packed row without padding, position "
        "ids restarting per row (TRL padding_free, verl use_remove_padding); "
        "max_tokens_per_micro_batch then bounds the packed tokens. Llama/Qwen2/Qwen3/Mistral "
        "under flash_attention_2/3 (varlen), sdpa or eager (a dense block-diagonal mask: "
        "slower than padding, docs/memory.md); another model runs padded, said once in the "
        "log. Same gradients as padded passes.",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute the policy's decoder layers in backward instead of keeping "
        "their activations (transformers' gradient checkpointing, non-reentrant): less memory "
        "per micro-batch, about one more forward of time. Same gradients.",
    )
    logits_chunk_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Token positions per pass through the output layer when computing "
        "log-probs and entropies: at most this many positions' logits are held at once, "
        "recomputed in backward (Llama/Qwen2/Qwen3/Mistral heads; others, and DDP or "
        "DeepSpeed wrappers, take the whole logits). None: the whole (B, T, V) logits.",
    )
    mini_batches_per_epoch: int = Field(
        default=1,
        ge=1,
        le=4096,
        description="Optimizer steps per inner epoch, 1 to 4096 (1: one step per epoch).",
    )
    warmup_steps: int = Field(
        default=0, ge=0, le=1_000_000, description="Linear LR warm-up steps, 0 to 1,000,000."
    )
    lr_schedule: LRSchedule = Field(
        default="constant",
        description="LR after warm-up: 'constant' or 'cosine' (decays to 0 at the last step).",
    )
    max_len_norm: int = Field(
        default=1024,
        ge=1,
        le=1_000_000,
        description="Constant length dividing token sums in 'seq-mean-token-sum-norm', "
        "1 to 1,000,000; set it to the rollout's max new tokens (paper: 1024).",
    )
    use_sampling_logprobs_as_old: bool = Field(
        default=False,
        description="Use the rollout engine's sampling log-probs as pi_old instead of "
        "recomputing them with the training model.",
    )
    temperature: float = Field(
        default=1.0,
        gt=0.0,
        le=10.0,
        description="Sampling temperature the log-probs are computed at, more than 0, at most 10.",
    )

    mask_truncated: bool = Field(
        default=False,
        description="Leave outputs cut at max_new_tokens out of the loss (DAPO's overlong "
        "filtering): their tokens count in no sum or mean of the update; their rewards still "
        "enter their group's baseline.",
    )
    dynamic_sampling: bool = Field(
        default=False,
        description="DAPO's dynamic sampling: drop the groups whose outputs all got the same "
        "reward (they give no outcome gradient) and sample further prompts until the step has "
        "prompts_per_step groups, or dynamic_sampling_max_rounds extra rounds were used.",
    )
    dynamic_sampling_max_rounds: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Most extra sampling rounds per step under dynamic_sampling, 0 to 100; "
        "each round draws as many new prompts as groups are still missing. A step that "
        "reaches the cap trains on the groups it has (metric batch_filled = 0).",
    )
    process_credit: ProcessCredit = Field(
        default="sum",
        description="How grpo_process turns normalised step rewards into a token's advantage: "
        "'sum' (paper: the sum over the steps ending at or after the token) or 'min' (PURE, "
        "Cheng et al. 2025: the minimum of those steps' rewards, so a run of high-scoring "
        "steps cannot outweigh one bad step).",
    )
    ppo: PPOConfig = Field(
        default_factory=PPOConfig,
        description="PPO's critic, GAE and KL-in-reward settings; read only when "
        "adv_estimator = ppo (grpo_core/algo/ppo_config.py).",
    )
    dpo: DPOConfig = Field(
        default_factory=DPOConfig,
        description="The DPO loss (beta, sigmoid or IPO, label smoothing, sequence log-prob); "
        "read only when adv_estimator = dpo or dpo_ranked (grpo_core/algo/dpo_config.py, "
        "docs/algorithm.md section 12).",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_replaced_fields(cls, data: Any) -> Any:
        """supervision and adv_scaling said, with adv_estimator, one thing three ways."""
        if isinstance(data, dict) and (data.keys() & REPLACED_BY_ADV_ESTIMATOR):
            given = {k: data[k] for k in REPLACED_BY_ADV_ESTIMATOR if k in data}
            raise ValueError(
                f"{', '.join(f'grpo.algo.{k}' for k in given)} was replaced by "
                f"grpo.algo.adv_estimator: use adv_estimator: {legacy_adv_estimator(data)} "
                "(supervision: process -> grpo_process; adv_scaling: none -> dr_grpo)"
            )
        return data

    def optimizer_settings(self, total_steps: int | None = None) -> OptimizerSettings:
        """The policy engine's optimizer settings; total_steps: optimizer steps of a stage."""
        return OptimizerSettings(
            lr=self.lr,
            weight_decay=self.weight_decay,
            betas=(self.adam_beta1, self.adam_beta2),
            max_grad_norm=self.max_grad_norm,
            warmup_steps=self.warmup_steps,
            lr_schedule=self.lr_schedule,
            total_steps=total_steps,
        )

    @model_validator(mode="after")
    def _options_fit_the_estimator(self) -> GRPOConfig:
        """Dynamic sampling drops groups with no spread in reward, which only a group-relative
        estimator ignores (RFT and SFT learn from such groups); process_credit shapes step
        rewards, which only a process estimator reads."""
        spec = self.estimator
        if self.dynamic_sampling and not spec.reads & {"rewards", "step_rewards"}:
            raise ValueError(
                f"grpo.algo.dynamic_sampling drops groups whose outputs got equal rewards, but "
                f"adv_estimator {spec.name} learns from those too: set dynamic_sampling: false, "
                "or use a group-relative estimator (grpo_outcome, dr_grpo, grpo_process)"
            )
        if self.process_credit != "sum" and not spec.needs_step_rewards:
            raise ValueError(
                f"grpo.algo.process_credit = {self.process_credit} shapes PRM step rewards, "
                f"which adv_estimator {spec.name} does not read: use adv_estimator: "
                "grpo_process, or leave process_credit at sum"
            )
        return self

    @model_validator(mode="after")
    def _correction_compares_two_policies(self) -> GRPOConfig:
        """The correction's weight pi_old / pi_sampler is 1 on every token when pi_old is the
        sampler's own log-probs: refused rather than run as a correction that corrects nothing."""
        if self.rollout_correction.on and self.use_sampling_logprobs_as_old:
            raise ValueError(
                f"grpo.algo.rollout_correction.mode = {self.rollout_correction.mode} weighs "
                "tokens by pi_old / pi_sampler, which is 1 everywhere when pi_old is the "
                "sampler's: set grpo.algo.use_sampling_logprobs_as_old: false (pi_old is then "
                "the trainer's), or rollout_correction.mode: off"
            )
        return self

    @model_validator(mode="after")
    def _dpo_has_no_policy_gradient_term(self) -> GRPOConfig:
        """The DPO loss has no per-token policy-gradient term for a KL term, a ratio level, a
        correction or a truncation mask to act on, and keeps a pair in one pass: such a
        setting would be silently ignored, so it is refused."""
        if not self.estimator.pairs:
            return self
        ignored = (
            (self.beta > 0, "beta: 0 (DPO's loss holds pi_ref itself; its weight is dpo.beta)"),
            (self.importance_sampling != "token", "importance_sampling: token"),
            (self.rollout_correction.on, "rollout_correction.mode: off"),
            (self.mask_truncated, "mask_truncated: false (a truncated output still pairs)"),
            (
                self.max_tokens_per_micro_batch is not None,
                "max_tokens_per_micro_batch: null (DPO passes micro_batch_size // 2 pairs)",
            ),
        )
        fixes = [fix for applies, fix in ignored if applies]
        if fixes:
            raise ValueError(
                f"grpo.algo.adv_estimator = {self.adv_estimator} trains with the DPO loss, which "
                f"does not use the clipped surrogate's settings: set grpo.algo.{fixes[0]}"
            )
        return self

    @field_validator("adv_estimator")
    @classmethod
    def _registered_estimator(cls, name: str) -> str:
        return ADVANTAGE_ESTIMATORS.check(name)

    @property
    def estimator(self) -> EstimatorSpec:
        """The advantage estimator with what it needs (step rewards, a data source, ...)."""
        return ADVANTAGE_ESTIMATORS[self.adv_estimator]

    @property
    def loss_reads_reference(self) -> bool:
        """The policy loss reads pi_ref's log-probs: its KL term (beta), or DPO's implicit
        reward (section 12)."""
        return self.beta > 0 or self.estimator.pairs

    @property
    def needs_reference(self) -> bool:
        """A reference model is run: for the loss (loss_reads_reference), or PPO's KL
        penalty in the reward."""
        return self.loss_reads_reference or (self.estimator.needs_values and self.ppo.kl_coef > 0)

    @property
    def clip_range(self) -> tuple[float, float]:
        """(eps_low, eps_high) of the ratio the loss clips: the token ratio's or the sequence
        ratio's (importance_sampling sequence / sequence_token)."""
        if self.importance_sampling == "token":
            return self.eps_low, self.eps_high
        return self.sequence_eps_low, self.sequence_eps_high

    @property
    def reads_sampling_logprobs(self) -> bool:
        """The update is handed the sampler's log-probs: as pi_old, or for the correction."""
        return self.use_sampling_logprobs_as_old or self.rollout_correction.on

    @property
    def process_supervision(self) -> bool:
        """Rewards per reasoning step (a PRM scores each step), not one per output."""
        return self.estimator.needs_step_rewards


def merge_trees(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, key by key: a mapping merges into a mapping, a value replaces."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_trees(merged[key], value)
        else:
            merged[key] = value
    return merged


# Fields of earlier versions that adv_estimator replaced (refused in new configs, migrated in
# the stored configs of earlier runs so they stay resumable).
REPLACED_BY_ADV_ESTIMATOR = ("supervision", "adv_scaling")


def legacy_adv_estimator(algo: dict[str, Any]) -> str:
    """The adv_estimator an earlier version's supervision / adv_scaling / adv_estimator meant."""
    if algo.get("adv_estimator"):
        return str(algo["adv_estimator"])
    if algo.get("supervision") == "process":
        return "grpo_process"
    return "dr_grpo" if algo.get("adv_scaling") == "none" else "grpo_outcome"


def migrate_replaced_fields(algo: dict[str, Any]) -> dict[str, Any]:
    """An earlier version's algo section in this version's form (adv_estimator alone)."""
    if not algo.keys() & REPLACED_BY_ADV_ESTIMATOR:
        return algo
    kept = {k: v for k, v in algo.items() if k not in REPLACED_BY_ADV_ESTIMATOR}
    return {**kept, "adv_estimator": legacy_adv_estimator(algo)}
