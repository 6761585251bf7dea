"""Which problems each GRPO step draws: the stage's prompt cursor (stored with its progress
checkpoint), dynamic sampling's extra rounds, which take the next prompts from it, and the
pool and groups of offline DPO's pairs file."""

from __future__ import annotations

import functools
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from grpo_core.algo.step import RewardFn, prompt_indices_at
from grpo_core.data.pairs_file import pair_problems, read_pairs
from grpo_core.data.tasks.base import Problem
from grpo_core.engines.pairs_rollout import PairsFileRollout
from grpo_core.model.prompts import Prompter
from reward_models.grpo_reward import GRPORewarder


@dataclass
class PromptCursor:
    """The stage's place in its prompt pool: each step takes prompts_per_step from here, and
    dynamic sampling's extra rounds the further ones they need; stored with the progress
    checkpoint so a resumed stage draws exactly the prompts the uninterrupted one would."""

    pool: list[Problem]
    position: int = 0

    def take(self, count: int) -> list[Problem]:
        """The next `count` problems (wrapping round the pool; at most the whole pool)."""
        problems = [self.pool[i] for i in prompt_indices_at(len(self.pool), self.position, count)]
        self.position += count
        return problems


def extra_round(
    cursor: PromptCursor,
    drawn: list[Problem],
    prompter: Prompter,
    rewarder: GRPORewarder,
    round_index: int,
    count: int,
) -> tuple[list[str], RewardFn]:
    """Dynamic sampling's further prompts: the next `count` of the cursor, appended to the
    step's `drawn` problems (StepOutcome.kept_prompts indexes them), with their reward. A
    step never draws a problem twice: once it has drawn the whole pool, no more come."""
    extra = cursor.take(min(count, len(cursor.pool) - len(drawn)))
    drawn.extend(extra)
    texts = [prompter(p.question) for p in extra]
    return texts, functools.partial(rewarder, extra, texts)


def pairs_pool(pairs_file: Path, seed: int) -> list[Problem]:
    """The pool of a stage on a pairs file: one problem per prompt, shuffled by the stage's
    seed (each iteration passes over the file in its own order)."""
    problems = pair_problems(read_pairs(pairs_file))
    random.Random(seed).shuffle(problems)
    return problems


def pairs_rollout(
    pairs_file: Path, prompter: Prompter, tokenizer: PreTrainedTokenizerBase
) -> PairsFileRollout:
    """The engine that answers each formatted prompt with its stored pairs."""
    options: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for pair in read_pairs(pairs_file):
        options[prompter(pair.prompt)].append((pair.chosen, pair.rejected))
    return PairsFileRollout(tokenizer, options)
