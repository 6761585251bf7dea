"""What the guards (flows/guards.py) found in a run, read from its store for the run's summary:
how many checks passed, and each one that tripped or could not judge, with why."""

from __future__ import annotations

from flows.guards import NOT_JUDGED_INFO
from storage.store import RunStore

GUARD_PREFIX = "guard_"


def guard_lines(store: RunStore, run_id: str) -> list[str]:
    """Markdown lines of the guards' verdicts of `run_id`'s committed stages (none when no
    guard stored a verdict or a reason: guards off, or a run stored before guards)."""
    where = f"name LIKE '{GUARD_PREFIX}%' AND step IS NULL"
    verdicts = store.read("metrics", run_id=run_id, where=where).to_pylist()
    # the commit readers see of each stage (a later attempt supersedes an earlier one)
    commits = {(c["iteration"], c["stage"]): c["info"] for c in store.committed_stages(run_id)}
    not_judged = [
        (iteration, stage, metric, why)
        for (iteration, stage), info in sorted(commits.items())
        for metric, why in sorted(info.get(NOT_JUDGED_INFO, {}).items())
    ]
    if not verdicts and not not_judged:
        return []
    tripped = sorted(
        (int(r["iteration"]), str(r["stage"]), str(r["name"])) for r in verdicts if r["value"]
    )
    passed = len(verdicts) - len(tripped)
    lines = [
        f"Guards (docs/guards.md): {passed} check(s) passed, {len(tripped)} tripped, "
        f"{len(not_judged)} not judged."
    ]
    lines += [f"- tripped: `{m}` in {s} of iteration {i}" for i, s, m in tripped]
    lines += [
        f"- not judged (no verdict stored): `{m}` in {s} of iteration {i}: {why}"
        for i, s, m, why in not_judged
    ]
    return lines
