"""Ctrl-C under the default Prefect engine: SIGINT to the process group of a real
`itergrpo run` stops it at the next safe point, exits 130 with the resume command, leaves no
process behind, and `itergrpo resume` finishes the run; a killed CLI takes its server along."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from storage.store import RunStore
from tests.flow_helpers import CLI_MODULE, REPO

pytestmark = pytest.mark.slow
RUN_ID = "pi"


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def start(*args: str, store: Path) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", CLI_MODULE, *args, "--store", str(store)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal gives a command
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def wait_for(lines: queue.Queue[str], text: str, seen: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"{text!r} not seen within {timeout} s:\n" + "".join(seen[-30:]))


def drain(lines: queue.Queue[str], seen: list[str]) -> str:
    while not lines.empty():
        seen.append(lines.get())
    return "".join(seen)


def test_ctrl_c_under_prefect_stops_at_a_safe_point_and_resumes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ("run", "--config", "micro", "--run-id", RUN_ID, "--set", "run.iterations=1")
    proc, lines = start(*args, store=store)
    seen: list[str] = []
    wait_for(lines, "GRPO iter 0 step 0", seen, timeout=240)
    children = descendants(proc.pid)
    assert children, "the temporary Prefect server should be running under the CLI"
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    sent = time.monotonic()
    code = proc.wait(timeout=60)
    stopped_in = time.monotonic() - sent
    time.sleep(0.5)
    text = drain(lines, seen)
    assert code == 130, text[-3000:]
    assert stopped_in < 10, f"took {stopped_in:.1f} s to stop"
    assert f"itergrpo resume {RUN_ID} --store {store}" in text
    assert "Traceback" not in text, text[-3000:]
    assert "Error logging to API" not in text, text[-3000:]
    deadline = time.monotonic() + 15
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(children), "a process of the run outlived it"
    assert RunStore(store).run_status(RUN_ID)["status"] == "interrupted"

    resumed, lines = start("resume", RUN_ID, store=store)
    code = resumed.wait(timeout=300)
    text = drain(lines, [])
    assert code == 0, text[-3000:]
    assert "Error logging to API" not in text, text[-3000:]
    assert "GRPO: resuming at step" in text
    assert RunStore(store).run_status(RUN_ID)["status"] == "completed"


def test_the_temporary_server_dies_with_a_killed_cli(tmp_path: Path) -> None:
    """kill -9 leaves no orphan: the server is tied to the CLI's life."""
    script = (
        "import os, time\n"
        "from flows.prefect_server import prefect_api\n"
        "with prefect_api():\n"
        "    print('up', flush=True)\n"
        "    time.sleep(120)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    cli = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert cli.stdout is not None and cli.stdout.readline().strip() == "up"
        server = descendants(cli.pid)
        assert server
        cli.kill()
        cli.wait()
        deadline = time.monotonic() + 15
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(server)
    finally:
        cli.kill()


def test_a_second_ctrl_c_under_prefect_stops_now_and_leaves_the_run_interrupted(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    args = ("run", "--config", "micro", "--run-id", RUN_ID, "--set", "run.iterations=1")
    proc, lines = start(*args, store=store)
    seen: list[str] = []
    wait_for(lines, "GRPO iter 0 step 0", seen, timeout=240)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # impatient: stop now, not at the next safe point
    code = proc.wait(timeout=60)
    time.sleep(0.5)
    text = drain(lines, seen)
    assert code == 130, text[-3000:]
    assert f"itergrpo resume {RUN_ID} --store {store}" in text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert RunStore(store).run_status(RUN_ID)["status"] == "interrupted"
