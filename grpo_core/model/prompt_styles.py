"""Prompt styles by name (prompt.style): the templates a question is put in, and how the
style lays out gold solutions. A leaf: the config checks style names against it, and the
Prompter (grpo_core/model/prompts.py) formats with it."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_core.contracts.registry import Registry


@dataclass(frozen=True)
class PromptStyle:
    """user: the user turn of a chat template; plain: the whole prompt without one (both
    with {question} and optionally {answer_instruction}); system: the system prompt;
    thinks: gold solutions are laid out as `<think>` steps `</think>` then the answer line
    (what the warm start trains on and the SFT data source gives), as the style asks."""

    name: str
    description: str
    user: str
    plain: str
    system: str = ""
    thinks: bool = False


PROMPT_STYLES: Registry[PromptStyle] = Registry("prompt style")

PROMPT_STYLES.add(
    "steps",
    PromptStyle(
        name="steps",
        description="step by step, one step per line, then the answer in the task's format",
        user="{question}\n\nSolve it step by step, one step per line, and {answer_instruction}.",
        plain="Q: {question}\nA:\n",
    ),
)
PROMPT_STYLES.add(
    "r1",
    PromptStyle(
        name="r1",
        description="DeepSeek-R1-Zero: reasoning inside <think>...</think>, then the answer",
        user=(
            "{question}\n\nFirst think about the reasoning process inside <think> </think>, "
            "then give the answer: {answer_instruction}."
        ),
        plain=(
            "A conversation between User and Assistant. The user asks a question, and the "
            "Assistant solves it. The Assistant first thinks about the reasoning process in "
            "the mind and then provides the user with the answer. The reasoning process is "
            "enclosed within <think> </think> tags, then the answer follows: "
            "{answer_instruction}.\nUser: {question}\nAssistant:"
        ),
        thinks=True,
    ),
)
