"""Prompt formats: the style's template (or the configured one) with the question and the task's
answer instruction, the system prompt, the tokenizer's chat template or the plain prompt, and
gold solutions laid out as the style asks (R1: steps inside <think>...</think>)."""

from __future__ import annotations

import pytest

from flows.config_files import load_config
from flows.errors import ConfigError
from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.model.config import PromptConfig
from grpo_core.model.policy import build_char_tokenizer, encode_prompt
from grpo_core.model.prompts import Prompter
from reward_models.parts.think_format import think_format_score

BOXED = ANSWER_FORMATS["boxed"].instruction
# A chat template like a chat model's: each turn tagged with its role.
CHAT = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def chat_tokenizer():  # type: ignore[no-untyped-def]
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHAT
    return tokenizer


def test_a_base_model_gets_the_plain_prompt_it_was_warm_started_on() -> None:
    prompter = Prompter(build_char_tokenizer())
    assert prompter("3+4") == "Q: 3+4\nA:\n"
    assert prompter.gold_output("3+4=7\n#### 7") == "3+4=7\n#### 7"


def test_a_chat_model_is_asked_for_the_answer_in_the_tasks_format() -> None:
    gsm8k = Prompter(chat_tokenizer())("What is 3+4?")
    assert gsm8k == (
        "[user] What is 3+4?\n\nSolve it step by step, one step per line, and end with a final "
        "line '#### <answer>' giving only the number.\n[assistant] "
    )
    boxed = Prompter(chat_tokenizer(), answer_instruction=BOXED)("What is 3+4?")
    assert "and put the final answer in \\boxed{}.\n[assistant] " in boxed


def test_the_template_and_the_system_prompt_are_configuration() -> None:
    config = PromptConfig(
        template="Problem: {question}\nPlease {answer_instruction}.", system="You are precise."
    )
    chat = Prompter(chat_tokenizer(), config, BOXED)("x?")
    assert chat == (
        "[system] You are precise.\n[user] Problem: x?\nPlease put the final answer in "
        "\\boxed{}.\n[assistant] "
    )
    plain = Prompter(build_char_tokenizer(), config, BOXED)("x?")
    assert plain == "You are precise.\n\nProblem: x?\nPlease put the final answer in \\boxed{}."


def test_never_using_the_chat_template_keeps_the_bos_token_of_a_plain_prompt() -> None:
    tokenizer = chat_tokenizer()
    prompter = Prompter(tokenizer, PromptConfig(chat_template="never"))
    prompt = prompter("3+4")
    assert prompt == tokenizer.bos_token + "Q: 3+4\nA:\n"
    plain_ids = encode_prompt(build_char_tokenizer(), "Q: 3+4\nA:\n")
    assert encode_prompt(tokenizer, prompt) == plain_ids  # the same tokens as a base model's


def test_the_r1_style_asks_for_think_then_the_answer_and_lays_gold_out_so() -> None:
    prompter = Prompter(build_char_tokenizer(), PromptConfig(style="r1"), BOXED)
    prompt = prompter("What is 3+4?")
    assert "<think> </think>" in prompt and prompt.endswith("User: What is 3+4?\nAssistant:")
    assert "put the final answer in \\boxed{}" in prompt
    gold = prompter.gold_output("3+4=7\nso \\boxed{7}")
    assert gold == "<think>\n3+4=7\n</think>\nso \\boxed{7}"
    assert think_format_score(gold, ANSWER_FORMATS["boxed"].ends_with_answer) == 1.0


@pytest.mark.parametrize(
    ("output", "score"),
    [
        ("<think>\n3+4=7\n</think>\n#### 7", 1.0),
        ("  <think>3+4 is 7</think> #### 7", 1.0),
        ("<think>\n3+4=7\n</think>\nso it is 7", 0.0),  # no well-formed answer after it
        ("<think></think>\n#### 7", 0.0),  # no reasoning
        ("3+4=7\n#### 7", 0.0),  # no think block
        ("<think>a</think>\n<think>b</think>\n#### 7", 0.0),  # two blocks
        ("#### 7\n<think>3+4=7</think>", 0.0),  # the block does not open the output
    ],
)
def test_the_think_format_pays_one_block_of_reasoning_then_an_answer(
    output: str, score: float
) -> None:
    assert think_format_score(output, ANSWER_FORMATS["gsm8k"].ends_with_answer) == score


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("prompt.style=chatty", "unknown prompt style 'chatty'"),
        ("prompt.template='Solve this.'", "must contain {question}"),
        ("prompt.template='{question} {hint}'", "no other {field}"),
    ],
)
def test_bad_prompt_settings_are_refused_naming_the_field(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match="prompt") as err:
        load_config("micro", [override])
    assert named in str(err.value)
