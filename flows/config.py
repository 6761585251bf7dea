"""The run configuration: one typed tree, loaded from YAML, that is also the Prefect form.

Sections owned by the component packages (task, policy, warm start, GRPO algorithm,
evaluation, reward models, labelling) are imported from them, and so are the cluster and
tracking sections (flows/cluster_config.py, flows/tracking/config.py); this module adds the
recipe-level sections (run, store, rollout, GRPO stage, engines) and the checks across
sections. Loading it from YAML presets and `--set` overrides: flows/config_files.py.
Pydantic bounds are not shown by the Prefect UI form, so every description states them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from flows.cluster_config import ClusterSection
from flows.engines_config import EnginesSection
from flows.grpo_presets import GRPO_PRESETS, apply_preset
from flows.guards import GuardsConfig
from flows.names import ITERATION_STAGES
from flows.stage_table import (
    STAGES,
    check_iteration_stages,
    iteration_stages_schema,
    unmet_need,
)
from flows.tracking.config import TrackingSection
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.estimators import ADVANTAGE_ESTIMATORS, DataSource
from grpo_core.algo.staleness_config import AsyncSettings
from grpo_core.contracts.paths import LocalPath
from grpo_core.data.curriculum import CurriculumSettings
from grpo_core.data.tasks.registry import TaskConfig
from grpo_core.model.config import (
    EvalConfig,
    LoRAConfig,
    PolicyConfig,
    PromptConfig,
    WarmStartConfig,
)
from reward_models.config import LabellingConfig, RewardModelConfig
from reward_models.parts import REWARD_PARTS, RewardWeights
from storage.store import resolve_store_root


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RunSection(_Section):
    """Identity, length and determinism of a run."""

    run_id: str | None = Field(
        None,
        description="Run id (letters, digits, '-', '_', '.'); empty: derived from the "
        "preset name and the time. Reusing an id resumes that run.",
    )
    seed: int = Field(0, ge=0, description="Base seed of everything random (>= 0).")
    iterations: int = Field(3, ge=1, le=1000, description="Iterations of Algorithm 1 (1 to 1000).")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where models run: auto (cuda if available), cpu or cuda."
    )
    num_threads: int | None = Field(
        None, ge=1, le=256, description="torch CPU threads (1 to 256); empty: torch default."
    )
    warm_start: bool = Field(
        True, description="Run supervised warm start (SFT) before iteration 0."
    )
    stages: list[str] = Field(
        default_factory=lambda: list(ITERATION_STAGES),
        min_length=1,
        description="The stages of each iteration, in order (the warm_start stage runs once "
        "before them; each stage must find what it reads written by those before it): "
        + "; ".join(f"'{name}' ({spec.summary})" for name, spec in STAGES.items() if not spec.once)
        + ".",
        json_schema_extra=iteration_stages_schema,
    )

    _stages_are_registered = field_validator("stages")(check_iteration_stages)


class StoreSection(_Section):
    """Where the run store lives, and what it keeps."""

    root: str = Field(
        "",
        description="Run store directory; empty: $ITERGRPO_STORE or ./itergrpo-store. "
        "The CLI records here the store it resolved (--store, then $ITERGRPO_STORE, then this "
        "field); it is not compared on resume, so a moved or restored store resumes.",
    )
    progress_checkpoints: Literal["remove", "keep"] = Field(
        "remove",
        description="GRPO progress checkpoints (grpo-progress/iter-k, where a stopped "
        "stage resumes): 'remove' each once its stage commits, or 'keep' (docs/store-and-sql.md).",
    )

    def resolved_root(self) -> Path:
        """This field when set (the CLI has resolved it), else $ITERGRPO_STORE or the default."""
        return resolve_store_root(self.root or None)


class RolloutSection(_Section):
    """Exploration samples labelled for the reward models each iteration."""

    prompts: int = Field(32, ge=1, le=100_000, description="Prompts sampled (1 to 100000).")
    group_size: int = Field(
        4, ge=1, le=1024, description="Outputs per prompt G for labelling (1 to 1024)."
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature (0 to 2).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (0 < p <= 1).")
    max_new_tokens: int = Field(
        48, ge=1, le=8192, description="Longest completion in tokens (1 to 8192)."
    )
    batch_size: int = Field(
        256, ge=1, le=65536, description="Sequences generated together (1 to 65536)."
    )


class GRPOStageSection(_Section):
    """The GRPO stage: M steps of sample -> reward -> advantages -> mu updates."""

    # `async` is a Python keyword: the field is async_ in code, `async` in YAML and dumps
    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    preset: str | None = Field(
        None,
        description="Named settings (flows/grpo_presets.py, docs/presets.md): a preset sets "
        "the fields it names over what was set before it (a base file, the --config file of a "
        "--set preset), except the fields set beside it or after it, even to the default: "
        + "; ".join(f"'{name}' ({preset.summary})" for name, preset in GRPO_PRESETS.items())
        + ". Empty: the fields as given.",
        json_schema_extra=lambda schema: schema.update(enum=[*GRPO_PRESETS, None]),
    )
    data_source: DataSource = Field(
        "online",
        description="What the policy is trained on: 'online' (G samples of the current policy "
        "per prompt: GRPO, Online RFT), 'policy_0' (G samples of the warm-started policy_0, "
        "the same distribution every step: RFT), 'gold' (the task's gold solutions: SFT), or "
        "'pairs_file' (the stored preference pairs of grpo.pairs_file: offline DPO).",
    )
    pairs_file: LocalPath = Field(
        None,
        description="A JSONL of preference pairs, one object per line with the question "
        "'prompt', the completions 'chosen' and 'rejected' and optionally the gold 'answer'; "
        "read with data_source pairs_file (offline DPO, docs/algorithm.md section 12), "
        "checked line by line before the run.",
    )
    steps: int = Field(10, ge=1, le=1_000_000, description="GRPO steps M per iteration (>= 1).")
    prompts_per_step: int = Field(32, ge=1, le=65536, description="Prompts per step (>= 1).")
    group_size: int = Field(
        8, ge=2, le=1024, description="Outputs per prompt G (2 to 1024): advantages need >= 2."
    )
    max_new_tokens: int = Field(48, ge=1, le=8192, description="Longest completion (1 to 8192).")
    rewards: RewardWeights = Field(
        default_factory=RewardWeights,
        description="A weight (>= 0) per reward part of the outcome reward (reward_models/"
        "parts/: the verifier, the format rule, the ORM, the PRM's outcome score, ...) and "
        "the parts' options.",
    )
    checkpoint_every: int = Field(
        5, ge=1, description="Save weights, optimizer, RNG and data cursor every N steps (>= 1)."
    )
    algo: GRPOConfig = Field(
        default_factory=GRPOConfig,
        description="The update itself (advantage estimator, loss, KL, clipping, optimizer, "
        "sampling temperature); see grpo_core/algo/config.py.",
    )
    lora: LoRAConfig = Field(
        default_factory=LoRAConfig,
        description="Train LoRA adapters on policy_k instead of all its weights (PEFT; "
        "docs/lora.md). Each iteration starts new adapters on the merged policy_k, which is also "
        "the reference; policy_{k+1} is stored merged, so every other stage loads it as usual.",
    )

    async_: AsyncSettings = Field(
        default_factory=AsyncSettings,
        alias="async",
        description="Asynchronous GRPO: sample the next steps' batches while the current one "
        "trains, at most max_staleness policy versions behind (docs/async.md).",
    )
    curriculum: CurriculumSettings = Field(
        default_factory=CurriculumSettings,
        description="Which task problems the stage draws: uniformly, or weighted by their "
        "pass rates in the run's earlier iterations (docs/curriculum.md).",
    )

    @field_validator("preset")
    @classmethod
    def _registered_preset(cls, name: str | None) -> str | None:
        return GRPO_PRESETS.check(name) if name else None  # the form sends "" when cleared

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """The preset fills the fields the raw input does not set (flows/grpo_presets.py)."""
        return apply_preset(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _curriculum_draws_task_problems(self) -> GRPOStageSection:
        if self.curriculum.mode != "off" and self.data_source == "pairs_file":
            raise ValueError(
                f"grpo.curriculum.mode = {self.curriculum.mode} weighs the task's problems, but "
                "grpo.data_source = pairs_file trains on the pairs file's prompts: set "
                "grpo.curriculum.mode=off"
            )
        return self

    @model_validator(mode="after")
    def _source_fits_estimator(self) -> GRPOStageSection:
        """Each estimator declares the data sources it trains on (grpo_core/algo/advantages.py)."""
        source, spec = self.data_source, self.algo.estimator
        if source not in spec.data_sources:
            fitting = [n for n, s in ADVANTAGE_ESTIMATORS.items() if source in s.data_sources]
            presets = [
                n for n, p in GRPO_PRESETS.items() if p.settings.get("data_source") == source
            ]
            why = (
                " (gold data gives every output of a group the same correct solution: a "
                "group-relative estimator has nothing to compare)"
                if source == "gold"
                else ""
            )
            raise ValueError(
                f"grpo.algo.adv_estimator = {spec.name} trains on data_source "
                f"{' or '.join(sorted(spec.data_sources))}, not {source}{why}: set "
                f"grpo.data_source: {sorted(spec.data_sources)[0]}, or for data_source = "
                f"{source} grpo.preset: {' / '.join(presets)} (adv_estimator: "
                f"{' / '.join(fitting)})"
            )
        if source == "gold" and self.algo.use_sampling_logprobs_as_old:
            raise ValueError(
                "grpo.data_source = gold has no sampling log-probs: set "
                "grpo.algo.use_sampling_logprobs_as_old: false"
            )
        if source == "pairs_file" and not self.pairs_file:
            raise ValueError(
                "grpo.data_source = pairs_file trains on the pairs of grpo.pairs_file, which is "
                "not set: set grpo.pairs_file: PATH (a JSONL of prompt / chosen / rejected)"
            )
        if self.pairs_file and source != "pairs_file":
            raise ValueError(
                f"grpo.pairs_file is read with data_source pairs_file only (got {source}): set "
                "grpo.preset: offline_dpo, or remove grpo.pairs_file"
            )
        if source == "pairs_file" and self.group_size != 2:
            raise ValueError(
                f"grpo.data_source = pairs_file gives each prompt one stored pair, a group of "
                f"2 outputs: set grpo.group_size: 2 (got {self.group_size})"
            )
        if source == "gold" and self.algo.rollout_correction.on:
            raise ValueError(
                "grpo.data_source = gold has no sampling log-probs to correct for: set "
                "grpo.algo.rollout_correction.mode: off"
            )
        return self

    @model_validator(mode="after")
    def _async_fits_the_algorithm(self) -> GRPOStageSection:
        """grpo.async samples the current policy ahead, on prompts known in advance, and its
        loss reads the sampler's log-probs (docs/algorithm.md section 15)."""
        k, algo = self.async_.max_staleness, self.algo
        if k == 0:
            return self
        where = f"grpo.async.max_staleness = {k}"
        if self.data_source != "online":
            raise ValueError(
                f"{where} lags the sampling policy behind the trained one, but data_source = "
                f"{self.data_source} does not sample the trained policy: set "
                "grpo.async.max_staleness: 0, or grpo.data_source: online"
            )
        if algo.dynamic_sampling:
            raise ValueError(
                f"{where} samples the next steps' prompts ahead, but grpo.algo.dynamic_sampling "
                "draws extra prompts as a step's rewards come in: set "
                "grpo.algo.dynamic_sampling: false, or grpo.async.max_staleness: 0"
            )
        if self.lora.enabled:
            raise ValueError(
                f"{where} hands the sampler full weights; with grpo.lora.enabled it is not "
                "supported yet: set grpo.lora.enabled: false, or grpo.async.max_staleness: 0"
            )
        if not algo.reads_sampling_logprobs:
            raise ValueError(
                f"{where} trains on batches an older policy sampled, so the loss must read the "
                "sampler's log-probs: set grpo.algo.use_sampling_logprobs_as_old: true (pi_old "
                "= the sampling policy) or grpo.algo.rollout_correction.mode: tis or mis (the "
                "decoupled objective, docs/algorithm.md section 15)"
            )
        return self


class ItergrpoConfig(_Section):
    """Everything a run needs. Loaded from YAML (configs/*.yaml), form of the Prefect flow."""

    run: RunSection = Field(default_factory=RunSection)
    store: StoreSection = Field(default_factory=StoreSection)
    task: TaskConfig = Field(default_factory=TaskConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    labelling: LabellingConfig = Field(default_factory=LabellingConfig)
    reward_models: RewardModelConfig = Field(default_factory=RewardModelConfig)
    grpo: GRPOStageSection = Field(default_factory=GRPOStageSection)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
    engines: EnginesSection = Field(default_factory=EnginesSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    guards: GuardsConfig = Field(
        default_factory=GuardsConfig,
        description="Checks on what the loop learns from, each with its action (docs/guards.md).",
    )

    @model_validator(mode="after")
    def _rewards_are_available(self) -> ItergrpoConfig:
        """What the weighted reward parts and the estimator need is trained (their registries
        declare it: reward_models/parts/, grpo_core/algo/estimators.py)."""
        rewards, rms = self.grpo.rewards, self.reward_models
        for name, weight in rewards.weights().items():
            for need in sorted(REWARD_PARTS[name].needs) if weight > 0 else []:
                if not rms.uses(need):
                    raise ValueError(
                        f"grpo.rewards.{name} > 0 needs reward_models.use_{need} = true (the "
                        f"run has no {need.upper()}): set use_{need}: true, or "
                        f"grpo.rewards.{name}: 0"
                    )
        estimator = self.grpo.algo.estimator
        if estimator.needs_step_rewards and not rms.use_prm:
            raise ValueError(
                f"grpo.algo.adv_estimator = {estimator.name} rewards each step with the PRM, but "
                "reward_models.use_prm = false: set use_prm: true, or adv_estimator: grpo_outcome"
            )
        if estimator.needs_values and self.grpo.algo.ppo.critic_init == "orm" and not rms.use_orm:
            raise ValueError(
                "grpo.algo.ppo.critic_init = orm starts the critic from the ORM, but "
                "reward_models.use_orm = false: set use_orm: true, or critic_init: policy"
            )
        per_token = [n for n, w in rewards.weights().items() if w > 0 and REWARD_PARTS[n].per_token]
        if estimator.needs_token_rewards and not per_token:
            parts = [name for name, part in REWARD_PARTS.items() if part.per_token]
            raise ValueError(
                f"grpo.algo.adv_estimator = {estimator.name} reads a reward per token, but no "
                f"per-token reward part ({', '.join(parts)}) has a weight: set one > 0 (e.g. "
                "grpo.rewards.teacher: 1 with grpo.rewards.teacher_path), or use another estimator"
            )
        if estimator.needs_weighted_reward and not any(rewards.weights().values()):
            raise ValueError(
                f"grpo.rewards: {', '.join(rewards.weights())} are all 0, so every GRPO "
                "advantage would be 0: give at least one a weight > 0 (the paper rewards with "
                "the ORM: grpo.rewards.orm: 1)"
            )
        return self

    @model_validator(mode="after")
    def _stages_find_what_they_read(self) -> ItergrpoConfig:
        """Each stage of the plan reads checkpoints and tables the stages before it write
        (their registrations declare both: flows/stage_table.py)."""
        problem = unmet_need(self.run.stages, self.run.iterations, self)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _batches_fit(self) -> ItergrpoConfig:
        rows = self.grpo.prompts_per_step * self.grpo.group_size
        if self.grpo.algo.mini_batches_per_epoch > rows:
            raise ValueError(
                f"grpo.algo.mini_batches_per_epoch ({self.grpo.algo.mini_batches_per_epoch}) "
                f"exceeds the {rows} outputs of a GRPO step (prompts_per_step x group_size): "
                "lower it or raise prompts_per_step"
            )
        return self

    @model_validator(mode="after")
    def _shards_can_use_the_device(self) -> ItergrpoConfig:
        if self.cluster.ray_address is None:
            return self
        if self.cluster.num_gpus_per_shard > 0 and self.run.device == "cpu":
            raise ValueError(
                "cluster.num_gpus_per_shard > 0 reserves GPUs that run.device = cpu never uses "
                "(set run.device to auto or cuda, or num_gpus_per_shard to 0)"
            )
        if self.cluster.num_gpus_per_shard == 0 and self.run.device == "cuda":
            raise ValueError(
                "run.device = cuda with Ray shards needs cluster.num_gpus_per_shard > 0: Ray "
                "hides the GPUs from tasks that reserve none"
            )
        return self

    @model_validator(mode="after")
    def _train_workers_can_use_the_device(self) -> ItergrpoConfig:
        gpus, device = self.engines.workers.num_gpus_per_rank, self.run.device
        fits = device == "auto" or (device == "cpu") == (gpus == 0)
        if self.engines.train_workers != "ray" or fits:
            return self
        raise ValueError(
            f"engines.workers.num_gpus_per_rank = {gpus} with run.device = {device}: CPU ranks "
            "(gloo) reserve 0 GPUs and CUDA ranks (NCCL) one each; set num_gpus_per_rank to "
            f"{0 if device == 'cpu' else 1}"
        )

    @model_validator(mode="after")
    def _lora_fits_the_engine(self) -> ItergrpoConfig:
        if self.grpo.lora.enabled and (
            self.engines.train != "torch" or self.engines.train_workers != "none"
        ):
            raise ValueError(
                f"grpo.lora.enabled = true with engines.train = {self.engines.train} and "
                f"engines.train_workers = {self.engines.train_workers}: LoRA adapters train "
                "with the torch engine in the stage's process only (DeepSpeed's ZeRO partitions, "
                "launched and Ray ranks hold the full weights; not checked with adapters). Set "
                "engines.train: torch and engines.train_workers: none, or grpo.lora.enabled: false"
            )
        return self

    @model_validator(mode="after")
    def _async_fits_the_engines(self) -> ItergrpoConfig:
        k = self.grpo.async_.max_staleness
        rollout = self.engines.grpo_rollout
        if k and not (
            self.engines.rollout_capabilities(rollout).shares_model
            and self.engines.updates_in_process
        ):
            raise ValueError(
                f"grpo.async.max_staleness = {k} samples on a thread beside the update, which "
                f"runs with an in-process engine only so far (got engines.rollout = "
                f"{self.engines.rollout}, train_workers = {self.engines.train_workers}): set "
                "engines.rollout: hf, engines.train_workers: none and no deepspeed launcher "
                "(processes_per_node 1, no hostfile), or grpo.async.max_staleness: 0"
            )
        return self

    @model_validator(mode="after")
    def _engines_fit_together(self) -> ItergrpoConfig:
        if self.engines.vllm.sync_backend == "nccl" and self.run.device == "cpu":
            raise ValueError(
                "engines.vllm.sync_backend = nccl needs CUDA tensors (run.device: cuda); on CPU "
                "set it to auto or gloo"
            )
        if self.engines.vllm.sleep_while_training and self.run.device == "cpu":
            raise ValueError(
                "engines.vllm.sleep_while_training needs a GPU (vLLM's CPU backend has no sleep "
                "mode): set run.device: cuda, or sleep_while_training: false"
            )
        if self.engines.rollout == "hf_generate" and self.cluster.ray_address is not None:
            raise ValueError(
                "engines.rollout = hf_generate with cluster.ray_address set: the Ray shards "
                "decode with the hf engine's own loop. Set engines.rollout: hf, or unset "
                "cluster.ray_address to decode with generate in the stage's process"
            )
        return self
