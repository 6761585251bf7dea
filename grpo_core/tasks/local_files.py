"""GSM8K-format problems from local jsonl/parquet files (`question`, `answer` ending `#### x`).

Loaded with `datasets.load_dataset("json"|"parquet", data_files=...)`: never a hub download.
"""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path

from grpo_core.answers import answers_match, extract_answer, normalize_number
from grpo_core.tasks.base import Problem, Split
from grpo_core.tasks.splits import split_of

log = logging.getLogger(__name__)
_CALCULATOR = re.compile(r"<<[^>]*>>")


def _builder(path: Path) -> str:
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix in (".jsonl", ".json", ".jsonl.gz", ".json.gz"):
        return "json"
    if suffix == ".parquet":
        return "parquet"
    raise ValueError(f"local_files path must end in .jsonl, .json or .parquet (got {path})")


def load_rows(path: str | Path) -> list[dict[str, str]]:
    """`question`/`answer` rows of a local GSM8K-format file."""
    from datasets import load_dataset

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"local_files path does not exist: {path}")
    data = load_dataset(_builder(path), data_files=str(path), split="train")
    missing = {"question", "answer"} - set(data.column_names)
    if missing:
        raise ValueError(f"{path} lacks columns {sorted(missing)} (has {data.column_names})")
    return [
        {"question": str(q), "answer": str(a)}
        for q, a in zip(data["question"], data["answer"], strict=True)
    ]


class LocalFilesTask:
    """Problems from `path` (and `test_path` if given; else a hash split of `path`)."""

    def __init__(
        self, path: str | Path, test_path: str | Path | None = None, test_fraction: float = 0.2
    ) -> None:
        self.name = f"local_files/{Path(path).name}"
        rows = load_rows(path)
        if test_path is None:
            self._rows: dict[Split, list[dict[str, str]]] = {
                s: [r for r in rows if split_of(r["question"], test_fraction) == s]
                for s in ("train", "test")
            }
        else:
            self._rows = {"train": rows, "test": load_rows(test_path)}

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` in a seeded order (all of them, with a warning, if fewer)."""
        rows = self._rows[split]
        if n > len(rows):
            log.warning("%s has %d %s problems; %d requested", self.name, len(rows), split, n)
        order = list(range(len(rows)))
        random.Random(f"local/{split}/{seed}").shuffle(order)
        out = []
        for i in order[:n]:
            row = rows[i]
            gold = extract_answer(row["answer"])
            if gold is None:
                raise ValueError(f"{self.name} row {i}: answer has no '#### <answer>' line")
            out.append(
                Problem(
                    problem_id=f"{self.name}-{split}-{i}",
                    question=row["question"],
                    answer=normalize_number(gold),
                    solution=_CALCULATOR.sub("", row["answer"]).strip(),
                )
            )
        return out

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return answers_match(extract_answer(completion), problem.answer)

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        return None
