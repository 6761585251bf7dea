"""The teacher of on-policy distillation (docs/distillation.md): a frozen local checkpoint
whose log-probs of the student's sampled tokens give the distillation reward, and the check
that it reads the student's token ids as the student does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.model.forward import sequence_logprobs
from grpo_core.model.policy import encode_prompt, load_policy


@dataclass(frozen=True)
class Teacher:
    """A frozen teacher on its device; `micro_batch_size` rows per forward pass (None: all)."""

    model: PreTrainedModel
    pad_token_id: int
    micro_batch_size: int | None = None

    def token_logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[list[float]]:
        """log p_teacher(y_t | q, y_<t) of every sampled token y_t of every output, from the
        logits divided by `temperature` (the sampler's, so both sides are the same tempered
        distribution); one list per output, as long as its completion."""
        if not completion_ids:
            return []
        batch = build_policy_batch(
            [list(p) for p in prompt_ids], [list(c) for c in completion_ids], self.pad_token_id
        )
        device = next(self.model.parameters()).device
        with torch.no_grad():
            full = sequence_logprobs(
                self.model, batch.to(device), temperature, self.micro_batch_size
            )
        response = batch.full_to_response(full.cpu())
        return [response[r, : len(ids)].tolist() for r, ids in enumerate(completion_ids)]


def load_teacher(
    path: str | Path, device: str, dtype: str = "float32", micro_batch_size: int | None = None
) -> Teacher:
    """The teacher checkpoint at `path` (an HF directory: a run's policy_N, any local model),
    frozen, in eval mode, on `device`. Loading draws nothing from the global RNG, so a stage
    that loads it resumes as it started."""
    with torch.random.fork_rng(devices=[]):
        model, tokenizer = load_policy(path, dtype)
    cast(nn.Module, model).to(device)  # typed: transformers wraps `.to`
    model.eval().requires_grad_(False)
    return Teacher(model, int(tokenizer.pad_token_id), micro_batch_size)


def tokenizer_mismatch(
    teacher: PreTrainedTokenizerBase, student: PreTrainedTokenizerBase, prompts: Sequence[str]
) -> str | None:
    """Why the teacher cannot score the student's token ids, None when it can: the teacher
    reads the ids the student sampled, so the two need one vocabulary (the same id for every
    token) and the same ids for each prompt."""
    teacher_vocab, student_vocab = teacher.get_vocab(), student.get_vocab()
    if teacher_vocab != student_vocab:
        differ = sorted(
            t
            for t in teacher_vocab.keys() | student_vocab.keys()
            if teacher_vocab.get(t) != student_vocab.get(t)
        )
        token = differ[0]
        return (
            f"their vocabularies differ ({len(teacher_vocab)} and {len(student_vocab)} tokens; "
            f"{len(differ)} tokens differ, e.g. {token!r}: id {teacher_vocab.get(token)} in "
            f"the teacher's, {student_vocab.get(token)} in the student's)"
        )
    for prompt in prompts:
        teacher_ids, student_ids = encode_prompt(teacher, prompt), encode_prompt(student, prompt)
        if teacher_ids != student_ids:
            return (
                f"they encode the prompt {prompt[:60]!r} to different ids "
                f"({teacher_ids[:8]}... and {student_ids[:8]}...)"
            )
    return None
