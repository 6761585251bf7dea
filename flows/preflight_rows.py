"""Every problem a run can draw checked before the run (flows/preflight_data.py calls it): its
prompt plus the largest max_new_tokens within the policy's context and reward_models.max_length.
A task read from rows (RowTask, local_files) has every row of both splits checked; a generated
task, the problems the pre-flight draws. Rows that do not fit are refused in one line naming
every limit, or left out (on_bad_rows: drop), as the run's task leaves them out. Also a warning
when most gold solutions are longer than what the sampling stages let the policy write."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from flows.errors import PreflightError
from flows.progress import log
from grpo_core.data.tasks.base import Problem, RowTask, Split, Task
from grpo_core.model.policy import prompt_adds_special_tokens
from grpo_core.model.prompts import Prompter

_BATCH = 1024  # texts per tokenizer call: a 10k-row file is ten calls, not 10k
_SOLUTIONS_MEASURED = 2000  # gold solutions tokenised for the warning at most
_WARNED: set[str] = set()  # the pre-flight and the run both check: each warning once a process


@dataclass(frozen=True)
class Limit:
    """A context that a prompt plus its completion must fit, named as the config or the
    model's config.json names it, and how a user makes it larger. `after_prompt`: the tokens
    this limit must hold after a prompt and the settings that make them, where that is more
    than the budget's (the policy's context also holds a labelling prefix and completion)."""

    name: str
    tokens: int
    fix: str
    after_prompt: tuple[int, str] | None = None


@dataclass(frozen=True)
class Budget:
    """What every prompt must fit: each of `limits`, with room for `new_tokens` (the largest
    max_new_tokens of the run, the setting `new_tokens_field`)."""

    new_tokens: int
    new_tokens_field: str
    limits: tuple[Limit, ...]

    def room(self, limit: Limit) -> int:
        """The tokens `limit` must hold after a prompt."""
        return limit.after_prompt[0] if limit.after_prompt else self.new_tokens

    @property
    def prompt_tokens(self) -> int:
        """The longest prompt that fits every limit."""
        return min(limit.tokens - self.room(limit) for limit in self.limits)


def drawn_problems(task: Task, wants: Mapping[Split, int], seed: int) -> dict[Split, list[Problem]]:
    """Every problem a run can draw from each split of `wants`: a RowTask's every row; a
    generated task's `wants[split]` problems drawn with `seed` (its settings bound the rest)."""
    if isinstance(task, RowTask):
        return {split: task.every_problem(split) for split in wants}
    return {split: task.problems(split, n, seed) for split, n in wants.items()}


def token_lengths(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], special: bool
) -> list[int]:
    """The number of tokens of each text, tokenised in batches (`special`: with the
    tokenizer's special tokens)."""
    out: list[int] = []
    for start in range(0, len(texts), _BATCH):
        batch = list(texts[start : start + _BATCH])
        out += [len(ids) for ids in tokenizer(batch, add_special_tokens=special)["input_ids"]]
    return out


def fitting_task(
    task: Task,
    drawn: Mapping[Split, Sequence[Problem]],
    prompter: Prompter,
    budget: Budget,
    section: str,
) -> tuple[Task, int]:
    """`task`, and how many of the `drawn` problems it left out: those whose prompt (as
    `prompter` writes it) plus `budget.new_tokens` exceeds a limit, dropped when `task` is a
    RowTask whose on_bad_rows is drop, else a PreflightError naming them. `section`: the
    task's config section (task.local_files), for the fix."""
    problems = [p for split in drawn.values() for p in split]
    prompts = [prompter(p.question) for p in problems]
    special = prompt_adds_special_tokens(prompter.tokenizer)
    lengths = token_lengths(prompter.tokenizer, prompts, special)
    over = [(n, p) for n, p in zip(lengths, problems, strict=True) if n > budget.prompt_tokens]
    if not over:
        return task, 0
    what, exceeded = _too_long(task, over, budget)
    if isinstance(task, RowTask) and task.on_bad_rows == "drop":
        _warn_once(
            f"task {task.name}: dropped {len(over)} of {len(problems)} rows too long for the "
            f"run ({section}.on_bad_rows: drop): {what}"
        )
        return task.without([p.problem_id for _, p in over]), len(over)
    if isinstance(task, RowTask):
        counted = "rows"
        fixes = [f"shorten or remove these rows, set {section}.on_bad_rows: drop to leave them out"]
    else:
        counted = "problems drawn"
        fixes = [f"make task {task.name}'s questions shorter ({section}.*)"]
    fixes.append("lower the max_new_tokens settings")
    fixes += [limit.fix for limit, count in zip(budget.limits, exceeded, strict=True) if count]
    raise PreflightError(
        f"task {task.name}: {len(over)} of {len(problems)} {counted} too long for the run: "
        f"{what}; {', '.join(fixes[:-1])}, or {fixes[-1]}"
    )


def _too_long(
    task: Task, over: Sequence[tuple[int, Problem]], budget: Budget
) -> tuple[str, list[int]]:
    """What the prompts in `over` (token count, problem) exceed and their longest, in words;
    and how many exceed each of budget.limits."""
    unit = "row(s)" if isinstance(task, RowTask) else "problem(s)"
    exceeded = [
        sum(n + budget.room(limit) > limit.tokens for n, _ in over) for limit in budget.limits
    ]
    against = ", ".join(
        f"exceeds {_named(limit)} in {count} {unit}" if count else f"fits {_named(limit)}"
        for limit, count in zip(budget.limits, exceeded, strict=True)
    )
    tokens, longest = max(over, key=lambda pair: pair[0])
    where = task.row_of(longest) if isinstance(task, RowTask) else repr(longest.problem_id)
    what = (
        f"prompt + up to {budget.new_tokens} new tokens ({budget.new_tokens_field}, the largest "
        f"max_new_tokens) {against}; the longest, {where}, has a {tokens}-token prompt"
    )
    return what, exceeded


def _named(limit: Limit) -> str:
    """A limit and its size in words, with what it holds after a prompt when that is its own."""
    if limit.after_prompt is None:
        return f"{limit.name} = {limit.tokens}"
    tokens, settings = limit.after_prompt
    return (
        f"{limit.name} = {limit.tokens} (with up to {tokens} tokens after the prompt: {settings})"
    )


def warn_long_solutions(
    task: Task, problems: Iterable[Problem], prompter: Prompter, max_new_tokens: Mapping[str, int]
) -> None:
    """Warn when most gold solutions (written as the prompt style asks) are longer than a
    sampling stage's max_new_tokens: its outputs would be cut before their final answer, so
    few could be right, and the reward models may get labels of one class."""
    solutions = [p.solution for p in problems if p.solution]
    if not solutions:
        return
    step = -(-len(solutions) // _SOLUTIONS_MEASURED)  # an even sample says whether most are
    outputs = [prompter.gold_output(solution) for solution in solutions[::step]]
    lengths = sorted(token_lengths(prompter.tokenizer, outputs, special=False))
    shares = {
        field: sum(n > limit for n in lengths) / len(lengths)
        for field, limit in max_new_tokens.items()
    }
    short = [
        f"{field} = {max_new_tokens[field]} ({share:.0%})"
        for field, share in shares.items()
        if share > 0.5
    ]
    if short:
        _warn_once(
            f"task {task.name}: most gold solutions are longer than the run lets the policy "
            f"write (median {lengths[len(lengths) // 2]} tokens, measured on {len(lengths)} of "
            f"{len(solutions)} solutions; "
            f"longer than {', '.join(short)}): outputs that long are cut before their final "
            "answer, so few can be right and the reward models may see one class of labels "
            "(the one-class guard stops the run); raise those max_new_tokens, or use problems "
            "with shorter solutions"
        )


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)
