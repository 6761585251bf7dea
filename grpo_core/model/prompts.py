"""Prompt styles by name, and the Prompter that turns a question into the policy's input: the
style's template (or the configured one) with the question and the task's answer instruction,
the system prompt, through the tokenizer's chat template when it has one.

- `steps` (the default): solve step by step, one step per line, then the answer as the task's
  answer format asks (`#### x` or `\\boxed{x}`). A base model without a chat template gets
  `Q: {question}\\nA:\\n`: it learns the solution format from the warm start's gold solutions.
- `r1` (DeepSeek-R1-Zero): the reasoning inside `<think>...</think>`, then the answer; the
  `think_format` reward part pays that format (its own weight in grpo.rewards).

Torch-free: the config checks style names against the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.model.config import PromptConfig
from grpo_core.model.prompt_styles import PROMPT_STYLES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GSM8K_INSTRUCTION = ANSWER_FORMATS["gsm8k"].instruction


@dataclass(frozen=True)
class Prompter:
    """The policy's input for a question. answer_instruction: how the task's answer format
    asks for the answer (AnswerFormat.instruction)."""

    tokenizer: PreTrainedTokenizerBase
    config: PromptConfig = field(default_factory=PromptConfig)
    answer_instruction: str = GSM8K_INSTRUCTION

    @property
    def uses_chat_template(self) -> bool:
        has_one = bool(getattr(self.tokenizer, "chat_template", None))
        return has_one and self.config.chat_template == "auto"

    def __call__(self, question: str) -> str:
        style = PROMPT_STYLES[self.config.style]
        system = style.system if self.config.system is None else self.config.system
        fields = {"question": question, "answer_instruction": self.answer_instruction}
        if self.uses_chat_template:
            user = (self.config.template or style.user).format(**fields)
            messages = [{"role": "system", "content": system}] if system else []
            messages.append({"role": "user", "content": user})
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            assert isinstance(text, str)
            return text
        plain = (self.config.template or style.plain).format(**fields)
        if system:
            plain = f"{system}\n\n{plain}"
        if getattr(self.tokenizer, "chat_template", None):
            # encode_prompt adds no special tokens to a chat tokenizer's prompts (templated
            # prompts carry theirs): a plain prompt for one carries its BOS itself.
            plain = (self.tokenizer.bos_token or "") + plain
        return plain

    def gold_output(self, solution: str) -> str:
        """A gold solution (one step per line, the answer line last) as the style asks for it:
        as it is, or its steps inside `<think>...</think>` before the answer line."""
        if not PROMPT_STYLES[self.config.style].thinks:
            return solution
        *steps, answer = solution.rstrip("\n").split("\n")
        return "<think>\n" + "\n".join(steps) + "\n</think>\n" + answer
