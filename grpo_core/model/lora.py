"""LoRA adapters on a policy (PEFT): attached in place, the base with the adapters off as the
reference, the merged weights as an ordinary HF state_dict, and the adapters' own files.

peft is an optional dependency (the `lora` extra); it is imported only when adapters are made.
"""

from __future__ import annotations

import json
import warnings
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from grpo_core.contracts.errors import MissingPathError, SettingError
from grpo_core.model.config import LoRAConfig

if TYPE_CHECKING:
    from peft import PeftModel

INSTALL = "pip install -e '.[lora]' (`make venv` does)"
ADAPTER = "default"  # PEFT's name of a model's one adapter
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's file names (save_pretrained)
ADAPTER_CONFIG = "adapter_config.json"


def require_peft() -> None:
    """A SettingError naming the extra unless peft is importable here."""
    if find_spec("peft") is None:
        import sys

        raise SettingError(
            "grpo.lora.enabled = true, but peft is not installed in this environment "
            f"({sys.executable}): install the lora extra: {INSTALL}; or set grpo.lora.enabled: "
            "false"
        )


def _leaf_names(model: nn.Module) -> dict[str, str]:
    """The last part of each named module's dotted name -> its class name (first seen)."""
    names: dict[str, str] = {}
    for name, module in model.named_modules():
        if name:
            names.setdefault(name.rsplit(".", 1)[-1], type(module).__name__)
    return names


def _is_adapter_key(key: str) -> bool:
    """A state_dict key of an adapter's own tensors (lora_A, lora_B, ...), not the base's."""
    return any(part.startswith("lora_") for part in key.split("."))


class LoRAAdapters:
    """Adapters injected into `model` in place (its forward now includes them), trained while
    every base weight is frozen. B starts at 0, so the adapted model begins equal to the base;
    A is drawn from `seed`."""

    def __init__(
        self, model: nn.Module, cfg: LoRAConfig, seed: int, base_dir: str | Path | None = None
    ) -> None:
        require_peft()
        from peft import LoraConfig, get_peft_model

        leaves = _leaf_names(model)
        missing = [name for name in cfg.target_modules if name not in leaves]
        if missing:
            linear = sorted(n for n, kind in leaves.items() if kind == "Linear")
            raise SettingError(
                f"grpo.lora.target_modules names {missing}, which the policy "
                f"({type(model).__name__}) does not have: choose among its linear layers "
                f"{linear}"
            )
        peft_config = LoraConfig(
            r=cfg.r,
            lora_alpha=cfg.alpha,
            lora_dropout=cfg.dropout,
            target_modules=list(cfg.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # peft asks the model a question transformers 5 has renamed (a FutureWarning)
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
            torch.manual_seed(seed)
            self.peft: PeftModel = get_peft_model(model, peft_config)
        if base_dir is not None:  # get_peft_model records the model's own name_or_path
            self.peft.peft_config[ADAPTER].base_model_name_or_path = str(base_dir)
        self.cfg = cfg
        self.model = model  # the same object, now with adapters: samplers keep sampling it

    def trainable(self) -> list[nn.Parameter]:
        """The parameters the update trains: the adapters' A and B matrices."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def reference(self) -> nn.Module:
        """The base model (policy_k) as a module: the adapted model with its adapters off."""
        return AdaptersOff(self.peft)

    @torch.no_grad()
    def merged_state_dict(self) -> dict[str, Tensor]:
        """The weights of the adapted model with each adapter folded in, W + (alpha/r) B A,
        under the base model's own state_dict keys (an ordinary HF checkpoint). The model is
        not changed: merging in place and back would leave rounding error in the base."""
        from peft.tuners.lora import LoraLayer

        deltas = {
            f"{name}.weight": cast(Any, module).get_delta_weight(ADAPTER)
            for name, module in self.model.named_modules()
            if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
        }
        merged: dict[str, Tensor] = {}
        for key, value in self.model.state_dict().items():
            if _is_adapter_key(key):
                continue
            plain = key.replace(".base_layer.", ".")
            delta = deltas.get(plain)
            # added in the adapters' precision, rounded once to the weight's (bf16 weights)
            merged[plain] = (
                value if delta is None else (value.to(delta.dtype) + delta).to(value.dtype)
            )
        return merged

    def save(self, directory: str | Path) -> None:
        """The adapters in PEFT's format (adapter_config.json + adapter_model.safetensors),
        loadable with peft.PeftModel.from_pretrained on the base model."""
        self.peft.save_pretrained(str(directory), safe_serialization=True)

    def differences(self, directory: str | Path) -> dict[str, tuple[Any, Any]]:
        """The settings (PEFT's names) in which the adapters `save` wrote to `directory` differ
        from these adapters': {field: (saved, now)}; empty when they fit."""
        saved = json.loads((Path(directory) / ADAPTER_CONFIG).read_text())
        cfg, targets = self.cfg, sorted(saved.get("target_modules") or [])
        pairs = {
            "r": (saved.get("r"), cfg.r),
            "lora_alpha": (saved.get("lora_alpha"), cfg.alpha),
            "lora_dropout": (saved.get("lora_dropout"), cfg.dropout),
            "target_modules": (targets, sorted(cfg.target_modules)),
        }
        return {field: pair for field, pair in pairs.items() if pair[0] != pair[1]}

    def load(self, directory: str | Path) -> None:
        """Copy the adapters `save` wrote into this model's adapters, in place (an optimizer
        built on them keeps its parameters)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        path = Path(directory)
        if not (path / ADAPTER_WEIGHTS).is_file():
            raise MissingPathError(f"no LoRA adapters at {path} ({ADAPTER_WEIGHTS} missing)")
        differs = self.differences(path)
        if differs:
            raise SettingError(
                f"the LoRA adapters at {path} were made with other grpo.lora settings "
                f"(saved, now: {differs}): load them with the settings they were made with"
            )
        result: Any = set_peft_model_state_dict(self.peft, load_file(str(path / ADAPTER_WEIGHTS)))
        if result.unexpected_keys:
            raise SettingError(
                f"the LoRA adapters at {path} hold tensors this policy has no place for "
                f"({result.unexpected_keys[:3]}): they were made for another model"
            )


class AdaptersOff(nn.Module):
    """The adapted model run with every adapter off and in eval mode: the base model, without
    a second copy of its weights (LoRA's reference model)."""

    def __init__(self, adapted: PeftModel) -> None:
        super().__init__()
        # Held outside the module tree: .to(), .eval() or .requires_grad_(False) on the
        # reference must not reach the shared weights or freeze the adapters.
        self._adapted = (adapted,)

    @property
    def module(self) -> nn.Module:
        """The wrapped HF model (cache_keyword reads its forward's signature)."""
        return self._adapted[0].get_base_model()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        adapted = self._adapted[0]
        training = adapted.training
        adapted.eval()
        try:
            with adapted.disable_adapter():
                return adapted.get_base_model()(*args, **kwargs)
        finally:
            adapted.train(training)
