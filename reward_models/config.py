"""Configuration of the reward models (their sources, formats, training) and of Math-Shepherd
labelling (torch-free)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.paths import absolute_path
from grpo_core.model.config import ModelDtype
from reward_models.formats import RM_FORMATS, RMFormat
from reward_models.objectives import POINTWISE, RM_OBJECTIVES

# The reward models the RM stage trains: outcome (one score per output) and process (per step).
RMKind = Literal["orm", "prm"]

# Where an RM starts: the policy checkpoint, the ORM just trained (PRM only), or a directory.
POLICY_SOURCE = "policy"
ORM_SOURCE = "orm"

# Fields of earlier versions that `orm` / `prm` replaced (refused in new configs, migrated in
# the stored configs of earlier runs so they stay resumable).
REPLACED_BY_SOURCES = ("init", "init_path", "prm_init")


class RewardModelSettings(BaseModel):
    """One reward model: where it starts, its format and tokens, and whether it trains."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    source: str = Field(
        POLICY_SOURCE,
        description=(
            "Where the iteration-0 reward model comes from: 'policy' (the policy checkpoint, "
            "as the paper initialises its RM from the base model), 'orm' (PRM only: the ORM "
            "just trained on the same iteration's outcome labels), or a local model directory "
            "(save_pretrained layout, with its own tokenizer; relative: to the current "
            "directory, stored absolute)."
        ),
    )
    format: str = Field(
        "scalar_head",
        description=(
            "What the checkpoint is and how it scores (docs/reward-models.md): 'scalar_head' "
            "(a new one-logit head on the source's backbone), 'classifier' (a pretrained "
            "one-logit sequence/token classifier), 'step_tag' (a causal LM read at a step tag: "
            "good vs bad next token, Math-Shepherd), 'two_class' (a two-class classifier read "
            "at a step separator, Qwen's PRMs)."
        ),
        json_schema_extra=RM_FORMATS.json_schema,
    )
    tokens: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "The format's token strings in the RM's own tokenizer; unset ones take the "
            "format's defaults. step_tag: tag (' ки'), good ('+'), bad ('-'); two_class: "
            "separator ('<extra_0>'); the other formats read none."
        ),
    )
    train: bool = Field(
        True,
        description=(
            "Train it: on each iteration's labels plus the replay, continued from the previous "
            "iteration's model. false: keep the source model frozen for the whole run (its "
            "checkpoint carried forward); a new head (scalar_head) cannot be frozen."
        ),
    )

    objective: str = Field(
        POINTWISE.name,
        description=(
            "What the reward model learns from the verifier's labels (docs/reward-models.md): "
            "'pointwise' (BCE of each output's score against its label, the paper's) or "
            "'pairwise' (ORM only: a Bradley-Terry model, -log sigmoid(r(right) - r(wrong)) "
            "over every right-wrong pair of one prompt's outputs, docs/algorithm.md section "
            "13; its score is still sigmoid(r))."
        ),
        json_schema_extra=RM_OBJECTIVES.json_schema,
    )

    @field_validator("source")
    @classmethod
    def _source_given(cls, source: str) -> str:
        if not source.strip():
            raise ValueError("source is empty: give 'policy', 'orm' or a model directory")
        keyword = source in (POLICY_SOURCE, ORM_SOURCE)
        return source if keyword else str(absolute_path(source))  # stored absolute

    @field_validator("format")
    @classmethod
    def _registered_format(cls, name: str) -> str:
        return RM_FORMATS.check(name)

    @field_validator("objective")
    @classmethod
    def _registered_objective(cls, name: str) -> str:
        return RM_OBJECTIVES.check(name)

    @model_validator(mode="after")
    def _tokens_of_the_format(self) -> RewardModelSettings:
        # The stored config then names every token, so a later default cannot change a run.
        self.tokens = self.spec.resolved_tokens(self.tokens)
        return self

    @property
    def spec(self) -> RMFormat:
        """The registered format with what it needs."""
        return RM_FORMATS[self.format]

    @property
    def is_path(self) -> bool:
        """Whether the source is a model directory (not the policy or the ORM)."""
        return self.source not in (POLICY_SOURCE, ORM_SOURCE)

    def check_for(self, kind: RMKind) -> None:
        """Raise SettingError when the `kind` RM cannot start or train as set."""
        where = f"reward_models.{kind}"
        spec = self.spec
        if self.source == ORM_SOURCE and kind == "orm":
            raise SettingError(
                f"{where}.source is 'orm': the ORM cannot start from itself; give 'policy' or "
                "a model directory"
            )
        if self.source == POLICY_SOURCE and not spec.from_policy:
            raise SettingError(
                f"{where}.format {self.format} reads a pretrained checkpoint's own head "
                f"({', '.join(spec.architectures)}), which the policy has not: set "
                f"{where}.source to its directory, or format: scalar_head to put a new head on "
                "the policy"
            )
        objective = RM_OBJECTIVES[self.objective]
        if kind not in objective.kinds:
            raise SettingError(
                f"{where}.objective is {self.objective}, which trains "
                f"{' and '.join(sorted(k.upper() for k in objective.kinds))}s only: set "
                f"{where}.objective: {POINTWISE.name}"
            )
        if not self.train and self.objective != POINTWISE.name:
            raise SettingError(
                f"{where}.objective is {self.objective} but {where}.train is false: a frozen "
                f"reward model learns nothing, so no objective applies; set {where}.train: "
                f"true, or drop {where}.objective"
            )
        if not self.train and spec.new_head and self.source != ORM_SOURCE:
            raise SettingError(
                f"{where}.train is false, but format scalar_head starts from a new, untrained "
                f"head: set {where}.train: true, or give a trained checkpoint (format "
                "classifier, step_tag or two_class)"
            )


class RewardModelConfig(BaseModel):
    """Which reward models the run has, where each starts and in what format, and their
    training settings."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    use_orm: bool = Field(
        True,
        description="Have an outcome reward model (one score per output; trained unless "
        "orm.train is false): true or false.",
    )
    use_prm: bool = Field(
        False,
        description="Have a process reward model (one score per step; trained unless "
        "prm.train is false): true or false.",
    )
    orm: RewardModelSettings = Field(
        default_factory=RewardModelSettings,
        description="The ORM's source, format, tokens and whether it trains.",
    )
    prm: RewardModelSettings = Field(
        default_factory=RewardModelSettings,
        description="The PRM's source ('orm' too: start from the ORM just trained), format, "
        "tokens and whether it trains.",
    )
    lr: float = Field(
        2e-5,
        gt=0.0,
        le=1.0,
        description=(
            "AdamW learning rate, > 0 and <= 1. 2e-5 is the paper's 7B setting; tiny CPU models "
            "learn in few steps with about 3e-4 (the demo's; at 1e-3 its ORM's AUROC hung on "
            "the seed, 0.73-0.95)."
        ),
    )
    epochs: int = Field(1, ge=1, le=100, description="Passes over the training mix, 1 to 100.")
    continual_epochs: int | None = Field(
        None,
        ge=1,
        le=100,
        description=(
            "Passes over the mix when continuing from the previous iteration's reward model "
            "(iterations >= 1), 1 to 100; empty: epochs. The continued model already ranks "
            "the policy's outputs, so fewer passes usually catch it up."
        ),
    )
    prm_epochs: int | None = Field(
        None,
        ge=1,
        le=1000,
        description=(
            "Passes over the PRM's mix at every iteration, 1 to 1000; empty: as the ORM "
            "(epochs, then continual_epochs). The PRM learns from the Math-Shepherd labels of "
            "labelling.prm_outputs outputs, far fewer examples than the ORM's, so it needs "
            "more passes for as many optimiser steps."
        ),
    )
    prm_continual_epochs: int | None = Field(
        None,
        ge=1,
        le=1000,
        description=(
            "Passes over the PRM's mix when continuing from PRM_k-1 (iterations >= 1), 1 to "
            "1000; empty: prm_epochs. Like the ORM, the continued PRM already ranks the "
            "policy's steps and catches up in fewer passes."
        ),
    )
    batch_size: int = Field(
        16, ge=1, le=4096, description="Examples (sequences) per optimiser step, 1 to 4096."
    )
    max_tokens_per_micro_batch: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="Token budget per forward/backward pass of reward-model training, as "
        "grpo.algo.max_tokens_per_micro_batch for the policy: each mini-batch of batch_size "
        "examples (pair groups for a pairwise ORM, kept whole) is sorted by length and packed "
        "so sequences x the pass's longest (prompt + completion tokens) stays within it; a "
        "longer item runs alone. Changes memory use and padding only, never the gradient. "
        "null: the whole mini-batch in one pass.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description=(
            "Recompute the reward models' decoder layers in backward while they train "
            "(transformers' gradient checkpointing, non-reentrant): less activation memory, "
            "about one more forward of time; same gradients."
        ),
    )
    prm_label: Literal["hard", "soft"] = Field(
        "hard",
        description=(
            "PRM target: 'hard' (1 if any Monte-Carlo completion reaches the gold answer) or "
            "'soft' (the fraction that do)."
        ),
    )
    replay_ratio: float = Field(
        0.10,
        ge=0.0,
        lt=1.0,
        description=(
            "Share of the RM training mix drawn from earlier iterations' labels, >= 0 and < 1 "
            "(paper: 0.10)."
        ),
    )
    max_length: int = Field(
        512,
        ge=8,
        le=32768,
        description="Longest prompt + completion in tokens, 8 to 32768; longer is an error.",
    )
    seed: int = Field(0, ge=0, description="Seed of head initialisation and batch order, >= 0.")
    dtype: ModelDtype = Field(
        "float32",
        description="Parameter dtype of the reward models at every load (training, scoring, "
        "the drift check); float32 on CPU. bf16-mixed: float32 parameters and AdamW state, "
        "training's forward passes under torch.autocast to bfloat16 (as policy.dtype).",
    )
    retrain: bool = Field(
        True,
        description=(
            "Retrain the reward models every iteration on the current policy's samples (paper). "
            "false: keep the iteration-0 reward models for the whole run (the control that shows "
            "what retraining buys; drift is still measured every iteration)."
        ),
    )
    eval_prompts: int = Field(
        256,
        ge=1,
        le=100_000,
        description=(
            "Held-out (test split) prompts on which each iteration measures the reward models "
            "against fresh outputs of the policy they are about to reward, 1 to 100000."
        ),
    )
    eval_samples: int = Field(
        4,
        ge=1,
        le=1024,
        description="Outputs sampled per held-out prompt for that measurement, 1 to 1024.",
    )

    def uses(self, kind: RMKind) -> bool:
        """Whether the run has the reward model `kind` (use_orm / use_prm)."""
        return self.use_orm if kind == "orm" else self.use_prm

    def epochs_of(self, kind: RMKind, *, continued: bool) -> int:
        """Passes over `kind`'s mix: from its source (continued False) or from RM_k-1."""
        first, later = self.epochs, self.continual_epochs
        if kind == "prm":
            first = self.prm_epochs or first
            later = self.prm_continual_epochs or self.prm_epochs or later
        return (later or first) if continued else first

    def settings(self, kind: RMKind) -> RewardModelSettings:
        """The source, format and tokens of the reward model `kind`."""
        return self.orm if kind == "orm" else self.prm

    @model_validator(mode="before")
    @classmethod
    def _refuse_replaced_fields(cls, data: Any) -> Any:
        """init / init_path / prm_init set both RMs' start at once; each RM now has its own."""
        if isinstance(data, dict) and (data.keys() & REPLACED_BY_SOURCES):
            given = [f"reward_models.{k}" for k in REPLACED_BY_SOURCES if k in data]
            now = migrate_replaced_fields(data)
            orm, prm = (now[k].get("source", POLICY_SOURCE) for k in ("orm", "prm"))
            raise ValueError(
                f"{', '.join(given)} {'was' if len(given) == 1 else 'were'} replaced by "
                "reward_models.orm.source and "
                f"reward_models.prm.source: use orm: {{source: {orm}}}, prm: {{source: {prm}}} "
                "(init: path -> the directory; prm_init: "
                "orm -> prm.source: orm)"
            )
        return data

    @model_validator(mode="after")
    def _sources_fit_formats(self) -> RewardModelConfig:
        kinds: tuple[RMKind, ...] = ("orm", "prm")
        for kind in [k for k in kinds if self.uses(k)]:
            self.settings(kind).check_for(kind)
        if not (self.use_prm and self.prm.source == ORM_SOURCE):
            return self
        if not self.use_orm:
            raise ValueError(
                "reward_models.prm.source is 'orm' but use_orm is false: the PRM would start "
                "from an ORM that is not trained; set use_orm: true, or prm.source: policy"
            )
        orm, prm = self.orm, self.prm
        if (prm.format, prm.tokens) != (orm.format, orm.tokens):
            raise ValueError(
                f"reward_models.prm.source is 'orm', so the PRM is the ORM's network, a "
                f"{orm.format} with tokens {orm.tokens}; but prm.format/tokens are "
                f"{prm.format} / {prm.tokens}: set them as the ORM's, or another prm.source"
            )
        return self


def migrate_replaced_fields(rm: dict[str, Any]) -> dict[str, Any]:
    """An earlier version's reward_models section in this version's form: init / init_path
    (the iteration-0 backbone of both RMs, a new head on it) and prm_init ('orm': the PRM starts
    from the ORM) become orm.source and prm.source. Old fields win over new ones: a stored
    ablation arm sets them after its base config."""
    if not rm.keys() & REPLACED_BY_SOURCES:
        return rm
    out = {k: v for k, v in rm.items() if k not in REPLACED_BY_SOURCES}
    orm, prm = dict(out.get("orm") or {}), dict(out.get("prm") or {})
    if "init" in rm or "init_path" in rm:
        path = rm.get("init_path") if rm.get("init") == "path" else None
        orm["source"] = str(path) if path else POLICY_SOURCE
    backbone = orm.get("source", POLICY_SOURCE)
    prm["source"] = ORM_SOURCE if rm.get("prm_init") == "orm" else backbone
    return {**out, "orm": orm, "prm": prm}


class LabellingConfig(BaseModel):
    """Monte-Carlo (Math-Shepherd) PRM labelling: completions per step prefix and sampling."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_completions: int = Field(
        4,
        ge=1,
        le=256,
        description="Completions sampled per step prefix (Math-Shepherd N), 1 to 256.",
    )
    max_new_tokens: int = Field(
        64, ge=1, le=8192, description="Token budget of each completion, 1 to 8192."
    )
    temperature: float = Field(
        1.0,
        gt=0.0,
        le=5.0,
        description="Sampling temperature of completions, > 0 and <= 5 (greedy would make N moot).",
    )
    batch_size: int = Field(
        64,
        ge=1,
        le=65536,
        description=(
            "Sequences per forward pass of the rollout engine, 1 to 65536; the flow builds the "
            "engine with it. All prefixes go to the engine in one call."
        ),
    )
    shared_prefixes: bool = Field(
        True,
        description=(
            "One Monte-Carlo estimate per distinct step prefix of a problem: outputs that share "
            "a prefix (a small policy repeats most of its first steps) share its N completions "
            "and its label, for a fraction of the sampling. false: N completions for every "
            "output's copy of the prefix, as runs started before this option did."
        ),
    )
    prm_outputs: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description=(
            "Rollout outputs given Math-Shepherd PRM labels per iteration (the first N in "
            "(problem_id, sample_index) order), 1 to 10000000; empty: all. Every output still "
            "gets its ORM label from the verifier, so a large rollout can feed the ORM while "
            "the Monte-Carlo labelling (N completions per step) stays affordable."
        ),
    )
