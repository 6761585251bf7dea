"""flows/fork.py: which committed stages of one run another run may start from (the rerun rule
across runs), on hand-made configs and plans."""

from __future__ import annotations

import copy
from typing import Any

from flows.fork import checkpoints_written, describe, differing_keys, shareable_prefix

ITERATION = ("rollout", "label", "train_rm", "grpo", "evaluate")
PLAN = [("warm_start", 0)] + [(s, k) for k in range(3) for s in ITERATION]
BASE: dict[str, Any] = {
    "run": {"run_id": "a", "seed": 1, "iterations": 3},
    "grpo": {"steps": 8, "preset": "grpo_os"},
    "reward_models": {"lr": 1e-4, "retrain": True},
    "evaluation": {"n_prompts": 32},
    "rollout": {"prompts": 32, "batch_size": 256},
    "prompt": {"style": "plain"},
    "labelling": {"completions": 4},
    "guards": {"rm_labels": "stop"},
    "store": {"root": "/a"},
    "tracking": {"mlflow": {"tags": {"arm": "a"}}},
    "cluster": {"ray_address": None},
}


def target(**changes: Any) -> dict[str, Any]:
    """BASE as another run (run id, store, tracking tags differ) with `changes` (dotted)."""
    out = copy.deepcopy(BASE)
    out["run"]["run_id"] = "b"
    out["store"]["root"] = "/b"
    out["tracking"]["mlflow"]["tags"] = {"arm": "b"}
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = out
        for part in path:
            node = node[part]
        node[last] = value
    return out


def prefix(config: dict[str, Any], committed: list[tuple[str, int]] = PLAN) -> list[Any]:
    return shareable_prefix(PLAN, committed, BASE, config)


def test_placement_and_run_id_do_not_count() -> None:
    assert differing_keys(BASE, target()) == []
    assert prefix(target()) == PLAN  # everything: the same run under another name


def test_retrain_shares_iteration_0_and_the_next_rollout_and_label() -> None:
    got = prefix(target(reward_models__retrain=False))
    assert got == PLAN[: 1 + 5 + 2]  # warm_start, iteration 0, rollout and label of 1
    assert got[-1] == ("label", 1)
    assert describe(got) == "warm_start..label of iteration 1"


def test_a_key_train_rm_reads_from_iteration_0_stops_before_it() -> None:
    assert prefix(target(reward_models__lr=3e-4)) == [
        ("warm_start", 0),
        ("rollout", 0),
        ("label", 0),
    ]


def test_a_key_warm_start_reads_shares_nothing() -> None:
    assert prefix(target(evaluation__n_prompts=16)) == []  # warm_start evaluates policy_0


def test_arms_of_other_methods_share_the_evaluation_of_policy_0() -> None:
    # what the iterations do is not read by the warm start (it loads and evaluates policy_0)
    assert prefix(target(grpo__steps=4)) == [("warm_start", 0)]
    assert prefix(target(grpo__preset="sft", rollout__prompts=16)) == [("warm_start", 0)]


def test_a_key_every_stage_reads_and_the_seed_share_nothing() -> None:
    assert prefix(target(prompt__style="chat")) == []
    assert prefix(target(rollout__batch_size=8)) == []  # the evaluation's sampler batch
    assert prefix(target(run__seed=2)) == []
    assert prefix(target(run__iterations=2)) == []


def test_guards_and_a_label_key() -> None:
    assert prefix(target(guards__rm_labels="warn")) == PLAN  # read by no stage's outputs
    assert prefix(target(labelling__completions=8)) == [("warm_start", 0), ("rollout", 0)]


def test_the_source_s_commits_bound_the_prefix() -> None:
    # a source that stopped after the GRPO stage of iteration 0
    assert prefix(target(), PLAN[:5]) == PLAN[:5]
    assert prefix(target(), PLAN[1:]) == []  # no warm_start: nothing in order to take
    assert prefix(target(reward_models__retrain=False), PLAN[:3]) == PLAN[:3]


def test_checkpoints_of_the_shared_stages() -> None:
    assert checkpoints_written(PLAN[:6]) == [
        ("policy", 0),
        ("orm", 0),
        ("prm", 0),
        ("policy", 1),
        ("policy-lora", 1),
        ("critic", 1),
    ]
    assert describe([("warm_start", 0)]) == "warm_start"
