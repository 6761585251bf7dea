"""A rollout engine that answers each prompt with its gold solution: the data source of SFT in
the unified paradigm (paper section 5.2.1), behind the same interface as the samplers, so a
GRPO step trains on it like on sampled outputs."""

from __future__ import annotations

from collections.abc import Mapping

from transformers import PreTrainedTokenizerBase

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.model.policy import encode_prompt


class GoldSolutionRollout:
    """n copies of each prompt's gold solution, tokenized as warm start tokenizes it (the
    solution, then EOS). Log-probs are 0: gold outputs were never sampled."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, solutions: Mapping[str, str]) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("gold solutions end with EOS: the tokenizer needs an eos_token")
        self.tokenizer = tokenizer
        self.solutions = dict(solutions)  # formatted prompt -> gold solution

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        """The same batch for any params and seed: the data is fixed."""
        missing = [p for p in prompts if p not in self.solutions]
        if missing:
            raise ValueError(f"no gold solution for prompt {missing[0]!r}")
        rows = [i for i in range(len(prompts)) for _ in range(n)]
        texts = [self.solutions[prompts[i]] for i in rows]
        completion_ids = [
            [*self.tokenizer(t, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
            for t in texts
        ]
        prompt_ids = [encode_prompt(self.tokenizer, prompts[i]) for i in rows]
        return RolloutBatch(
            prompt_index=rows,
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            texts=texts,
            finish_reasons=["stop"] * len(rows),
            logprobs=[[0.0] * len(ids) for ids in completion_ids],
        )
