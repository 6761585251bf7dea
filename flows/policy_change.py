"""What the run's RL changed: its last evaluated policy against policy_0 on the same test
problems, paired by problem, with standard errors over questions.

The table beside it gives each policy's accuracy with the standard error of that accuracy,
which mostly measures how hard the questions are; two policies answering the same questions
share that, and the paired difference does not carry it (grpo_core.model.evaluate.
paired_difference). This is the figure that says whether a change is beyond the evaluation's
noise in one run; `itergrpo ablate` says whether it holds over seeds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from flows.names import EVAL_SPLIT
from grpo_core.model.evaluate import paired_difference
from storage.store import RunStore

# (stored metric, label): the accuracies the table shows; Maj@K at the largest K evaluated.
CHANGE_METRICS = (("greedy_accuracy", "greedy"), ("sampled_accuracy", "sampled"), ("maj@k", "Maj"))


@dataclass(frozen=True)
class MetricChange:
    """One metric's paired change: mean of (last policy - policy_0) per problem, its s.e."""

    label: str
    mean: float
    se: float

    def text(self) -> str:
        if self.se == 0.0:  # every question moved alike (usually: not at all)
            return f"{self.label} {self.mean:+.3f} (the same change on every question)"
        return f"{self.label} {self.mean:+.3f}±{self.se:.3f} ({self.mean / self.se:+.1f} s.e.)"


@dataclass(frozen=True)
class PolicyChange:
    """The last evaluated policy against policy_0 on `problems` problems of `questions`
    different questions."""

    policy: int
    problems: int
    questions: int
    metrics: tuple[MetricChange, ...]


# per (policy, metric, k): problem_index -> (problem_id, question, value)
_Values = dict[tuple[int, str, int], dict[int, tuple[str, str, float]]]


def _paired(
    values: _Values, first: tuple[int, str, int], last: tuple[int, str, int]
) -> tuple[list[float], list[float], list[str]] | None:
    """(last's values, first's values, questions) in problem order, or None when the two
    were not evaluated on the same problems."""
    before, after = values.get(first, {}), values.get(last, {})
    if not before or before.keys() != after.keys():
        return None
    order = sorted(before)
    if any(before[i][0] != after[i][0] for i in order):
        return None
    questions = [before[i][1] for i in order]
    return [after[i][2] for i in order], [before[i][2] for i in order], questions


def policy_change(store: RunStore, run_id: str) -> PolicyChange | None:
    """The paired change from policy_0 to the last evaluated policy, on the metrics both were
    evaluated on with the same problems; None before a second policy is evaluated, or for
    stores written before per-problem rows were kept."""
    rows = store.read("eval_problems", run_id=run_id, where=f"split = '{EVAL_SPLIT}'").to_pylist()
    values: _Values = defaultdict(dict)
    for row in rows:
        key = (int(row["policy_iteration"]), row["metric"], int(row["k"]))
        question = row["question"] if row["question"] is not None else row["problem_id"]
        values[key][int(row["problem_index"])] = (row["problem_id"], question, float(row["value"]))
    policies = {policy for policy, _, _ in values}
    if 0 not in policies or len(policies) < 2:
        return None
    last = max(policies)
    changes: list[MetricChange] = []
    counts: tuple[int, int] = (0, 0)
    for metric, label in CHANGE_METRICS:
        ks = sorted(k for p, m, k in values if p == 0 and m == metric and (last, m, k) in values)
        if not ks:
            continue
        k = ks[-1]
        paired = _paired(values, (0, metric, k), (last, metric, k))
        if paired is None:
            continue
        after, before, questions = paired
        mean, se = paired_difference(after, before, questions)
        changes.append(MetricChange(f"{label}@{k}" if metric.endswith("@k") else label, mean, se))
        counts = (len(questions), len(set(questions)))
    if not changes:
        return None
    return PolicyChange(last, counts[0], counts[1], tuple(changes))


def format_policy_change(change: PolicyChange) -> str:
    """Two lines for the terminal and the summary: what is compared, then each metric."""
    head = (
        f"policy_{change.policy} - policy_0 on the same {change.problems} test problems "
        f"({change.questions} questions), paired, ± 1 s.e. over questions:"
    )
    return head + "\n" + "  ".join(m.text() for m in change.metrics)
