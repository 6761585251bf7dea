"""Configuration of reward-model training and of Math-Shepherd labelling (torch-free)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The reward models the RM stage trains: outcome (one score per output) and process (per step).
RMKind = Literal["orm", "prm"]


class RewardModelConfig(BaseModel):
    """Which reward models to train, how to initialise them, and their optimiser settings."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    use_orm: bool = Field(
        True, description="Train an outcome reward model (one score per output): true or false."
    )
    use_prm: bool = Field(
        False, description="Train a process reward model (one score per step): true or false."
    )
    init: Literal["policy", "path"] = Field(
        "policy",
        description=(
            "Backbone of the iteration-0 reward model: 'policy' (the current policy checkpoint, "
            "as the paper initialises its RM from the base model) or 'path' (init_path)."
        ),
    )
    init_path: Path | None = Field(
        None,
        description="Local model directory used when init is 'path'; must be set then, else unset.",
    )
    prm_init: Literal["backbone", "orm"] = Field(
        "backbone",
        description=(
            "Starting point of the iteration-0 PRM: 'backbone' (as init says, like the ORM) or "
            "'orm' (the ORM just trained on the same iteration's outcome labels: it already "
            "tells right from wrong outputs on thousands of verifier labels, and the PRM "
            "refines that on the far fewer Math-Shepherd step labels). 'orm' needs use_orm."
        ),
    )
    lr: float = Field(
        2e-5,
        gt=0.0,
        le=1.0,
        description=(
            "AdamW learning rate, > 0 and <= 1. 2e-5 is the paper's 7B setting; tiny CPU models "
            "learn in few steps only with about 1e-3."
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
    batch_size: int = Field(
        16, ge=1, le=4096, description="Examples (sequences) per optimiser step, 1 to 4096."
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

    def trains(self, kind: RMKind) -> bool:
        """Whether the RM stage trains the reward model `kind` (use_orm / use_prm)."""
        return self.use_orm if kind == "orm" else self.use_prm

    @model_validator(mode="after")
    def _init_path_matches_init(self) -> RewardModelConfig:
        if self.init == "path" and self.init_path is None:
            raise ValueError("reward_model.init is 'path' but init_path is unset: give a model dir")
        if self.init == "policy" and self.init_path is not None:
            raise ValueError(
                f"reward_model.init_path is set ({self.init_path}) but init is 'policy': "
                "set init: path to use it, or drop init_path"
            )
        if self.prm_init == "orm" and not (self.use_orm and self.use_prm):
            raise ValueError(
                "reward_models.prm_init is 'orm' but use_orm/use_prm are "
                f"{self.use_orm}/{self.use_prm}: it needs both reward models, or set "
                "prm_init: backbone"
            )
        return self


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
