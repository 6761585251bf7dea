"""flows/data_fingerprint.py: what tells a run's data from other data, on a jsonl file, a parquet
file and a folder; and the config's paths, made absolute when it is read."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.config_files import load_config
from flows.data_fingerprint import Fingerprint, fingerprint


def fp(path: Path) -> Fingerprint:
    found = fingerprint(path)
    assert found is not None
    return found


def test_a_jsonl_file_counts_its_rows_and_any_edit_changes_its_hash(tmp_path: Path) -> None:
    data = tmp_path / "a.jsonl"
    data.write_text('{"q": 1}\n\n{"q": 2}\n')
    first = fp(data)
    assert (first.kind, first.rows, first.bytes, first.files) == ("file", 2, 19, 1)
    assert first.summary() == f"2 rows, 19 bytes, sha256 {first.sha256[:12]}"
    stat = data.stat()
    data.write_text('{"q": 1}\n\n{"q": 3}\n')  # same size, same mtime: only the bytes differ
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert not fp(data).same_data(first)


def test_the_same_bytes_elsewhere_are_the_same_data(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for folder in ("a", "b"):
        (tmp_path / folder / "x.jsonl").write_text('{"q": 1}\n')
    assert fp(tmp_path / "a" / "x.jsonl").same_data(fp(tmp_path / "b" / "x.jsonl"))
    assert fp(tmp_path / "a").same_data(fp(tmp_path / "b"))


def test_a_parquet_file_counts_its_rows_from_its_metadata(tmp_path: Path) -> None:
    pq.write_table(pa.table({"question": ["a", "b", "c"]}), tmp_path / "t.parquet")
    assert fp(tmp_path / "t.parquet").rows == 3
    (tmp_path / "t.json").write_text('[{"q": 1}]')
    assert fp(tmp_path / "t.json").summary().startswith("10 bytes, sha256 ")  # rows not counted


def test_a_folder_changes_with_a_file_added_renamed_or_edited_not_with_hidden_ones(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "saved"
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "data-0.arrow").write_bytes(b"rows")
    first = fp(folder)
    assert (first.kind, first.files, first.bytes, first.rows) == ("folder", 1, 4, None)
    (folder / ".cache").mkdir()
    (folder / ".cache" / "lock").write_text("x")
    (folder / ".DS_Store").write_text("x")
    assert fp(folder).same_data(first)
    (folder / "train" / "data-0.arrow").rename(folder / "train" / "data-1.arrow")
    assert not fp(folder).same_data(first)
    (folder / "train" / "data-1.arrow").rename(folder / "train" / "data-0.arrow")
    assert fp(folder).same_data(first)
    (folder / "test.jsonl").write_text("{}\n")
    assert fp(folder).files == 2 and not fp(folder).same_data(first)


def test_nothing_there_has_no_fingerprint(tmp_path: Path) -> None:
    assert fingerprint(tmp_path / "missing.jsonl") is None


def test_config_paths_are_absolute_once_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        "micro",
        [
            "task.name=local_files",
            "task.local_files.path=data/train.jsonl",
            "task.local_files.test_path=~/test.jsonl",
            "policy.path=models/p",
            "reward_models.orm.source=models/rm",
            "reward_models.prm.source=orm",
            "engines.deepspeed.hostfile=hosts",
        ],
    )
    assert cfg.task.local_files.path == str(tmp_path / "data" / "train.jsonl")
    assert cfg.task.local_files.test_path == str(Path.home() / "test.jsonl")
    assert cfg.policy.path == str(tmp_path / "models" / "p")
    assert cfg.reward_models.orm.source == str(tmp_path / "models" / "rm")
    assert cfg.reward_models.prm.source == "orm"  # a name, not a path
    assert cfg.engines.deepspeed.hostfile == str(tmp_path / "hosts")
    assert load_config("micro").policy.path is None
