"""A rollout engine that answers each prompt with a stored preference pair, chosen then
rejected: the data source of offline DPO (grpo.data_source = pairs_file), behind the same
interface as the samplers, so a GRPO step trains on it like on sampled groups of two."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from transformers import PreTrainedTokenizerBase

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.model.policy import encode_prompt


class PairsFileRollout:
    """Groups of two per prompt: a pair's chosen and rejected completion, each tokenized then
    EOS (as gold solutions are). A prompt with several pairs answers with one of them drawn
    from the step's seed, so a resumed step draws the same. Log-probs are 0: never sampled."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, pairs: Mapping[str, Sequence[tuple[str, str]]]
    ) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("stored completions end with EOS: the tokenizer needs an eos_token")
        self.tokenizer = tokenizer
        self.pairs = {prompt: list(options) for prompt, options in pairs.items()}

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        """The pairs of `prompts`, chosen first; n must be 2 (a group is one pair)."""
        if n != 2:
            raise ValueError(f"a stored pair is a group of 2 outputs (got group size {n})")
        missing = [p for p in prompts if p not in self.pairs]
        if missing:
            raise ValueError(f"no stored pair for prompt {missing[0]!r}")
        draw = random.Random(seed)
        texts = [t for p in prompts for t in self.pairs[p][draw.randrange(len(self.pairs[p]))]]
        rows = [i for i in range(len(prompts)) for _ in range(n)]
        eos = self.tokenizer.eos_token_id
        completion_ids = [
            [*self.tokenizer(t, add_special_tokens=False)["input_ids"], eos] for t in texts
        ]
        return RolloutBatch(
            prompt_index=rows,
            prompt_ids=[encode_prompt(self.tokenizer, prompts[i]) for i in rows],
            completion_ids=completion_ids,
            texts=texts,
            finish_reasons=["stop"] * len(rows),
            logprobs=[[0.0] * len(ids) for ids in completion_ids],
        )
