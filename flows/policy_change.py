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

from flows.eval_values import GREEDY, MAJ, SAMPLED, in_problem_order
from flows.names import EVAL_SPLIT
from grpo_core.model.evaluate import paired_difference
from storage.store import RunStore

# (stored metric, label): the accuracies the table shows; Maj@K at the largest K evaluated.
CHANGE_METRICS = ((GREEDY, "greedy"), (SAMPLED, "sampled"), (MAJ, "Maj"))


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


def policy_change(store: RunStore, run_id: str) -> PolicyChange | None:
    """The paired change from policy_0 to the last evaluated policy, on the metrics both were
    evaluated on with the same problems; None before a second policy is evaluated, or for
    stores written before per-problem rows were kept."""
    rows = store.read("eval_problems", run_id=run_id, where=f"split = '{EVAL_SPLIT}'").to_pylist()
    listed: dict[tuple[int, str, int], list[tuple[int, str, float, str | None]]] = defaultdict(list)
    for r in rows:
        entry = (int(r["problem_index"]), r["problem_id"], float(r["value"]), r["question"])
        listed[int(r["policy_iteration"]), r["metric"], int(r["k"])].append(entry)
    problems = {key: in_problem_order(found) for key, found in listed.items()}
    last = max((policy for policy, _, _ in problems), default=0)
    if last == 0 or not any(policy == 0 for policy, _, _ in problems):
        return None
    changes: list[MetricChange] = []
    questions: list[str] = []
    for metric, label in CHANGE_METRICS:
        ks = [k for p, m, k in problems if p == 0 and m == metric and (last, m, k) in problems]
        if not ks:
            continue
        k = max(ks)
        before, after = problems[0, metric, k], problems[last, metric, k]
        if before.problem_ids != after.problem_ids:
            continue
        # older rows have no question: each problem is then its own cluster
        questions = [q or pid for q, pid in zip(before.questions, before.problem_ids, strict=True)]
        mean, se = paired_difference(after.values, before.values, questions)
        changes.append(MetricChange(f"{label}@{k}" if metric == MAJ else label, mean, se))
    if not changes:
        return None
    return PolicyChange(last, len(questions), len(set(questions)), tuple(changes))


def format_policy_change(change: PolicyChange) -> str:
    """Two lines for the terminal and the summary: what is compared, then each metric."""
    head = (
        f"policy_{change.policy} - policy_0 on the same {change.problems} test problems "
        f"({change.questions} questions), paired, ± 1 s.e. over questions:"
    )
    return head + "\n" + "  ".join(m.text() for m in change.metrics)
