"""The Python tool's sandbox: a plain program answers; every runaway, crashing or hostile one
is stopped and reported with its kind, and the caller never stalls (grpo_core/data/
python_sandbox.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_core.data.python_sandbox import SandboxLimits, network_isolation, run_python

LIMITS = SandboxLimits(wall_seconds=3.0, cpu_seconds=2, memory_mb=256, output_bytes=4096)


def test_a_program_prints_its_answer_and_keeps_files_in_its_directory() -> None:
    result = run_python(
        "open('note.txt', 'w').write('41')\nprint(int(open('note.txt').read()) + 1)"
    )
    assert (result.status, result.observation()) == ("ok", "42\n")


def test_an_exception_is_an_error_the_model_reads() -> None:
    result = run_python("x = [1, 2]\nprint(x[5])", LIMITS)
    assert result.status == "error"
    assert result.observation() == "error: IndexError: list index out of range"


@pytest.mark.parametrize(
    ("program", "status", "says"),
    [
        ("import os\nwhile True:\n    os.fork()", "forbidden", "os.fork is not allowed"),
        (
            "import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])",  # fork bomb
            "forbidden",
            "not allowed",
        ),
        ("import os\nos.system('echo hi')", "forbidden", "os.system is not allowed"),
        ("import ctypes", "forbidden", "import ctypes is not allowed"),
        ("open('/tmp/itergrpo-escape.txt', 'w').write('x')", "forbidden", "outside the working"),
        ("import os\nos.remove('/etc/hostname')", "forbidden", "outside the working"),
        ("import socket\nsocket.socket().connect(('127.0.0.1', 22))", "forbidden", "socket"),
        ("x = bytearray(1 << 30)", "memory_limit", "memory limit of 256 MB"),
        ("while True:\n    print('x' * 1000)", "output_limit", "over 4096 bytes"),
        ("print('y' * 5000)", "output_limit", "over 4096 bytes"),
        ("open('big.bin', 'wb').write(b'0' * 10000)", "output_limit", "over 4096 bytes"),
    ],
)
def test_hostile_programs_are_contained_and_reported(program: str, status: str, says: str) -> None:
    result = run_python(program, LIMITS)
    assert result.status == status
    assert says in result.observation()
    assert not Path("/tmp/itergrpo-escape.txt").exists()


def test_an_endless_loop_is_stopped_at_the_wall_timeout() -> None:
    result = run_python("while True:\n    pass", LIMITS)
    assert result.status in ("timeout", "cpu_limit")
    assert result.seconds < LIMITS.wall_seconds + 2.0


def test_a_sleeping_program_is_stopped_at_the_wall_timeout() -> None:
    result = run_python("import time\ntime.sleep(60)", SandboxLimits(wall_seconds=1.0))
    assert result.status == "timeout"
    assert 1.0 <= result.seconds < 3.0


def test_cpu_time_is_limited_below_the_wall_timeout() -> None:
    result = run_python("while True:\n    pass", SandboxLimits(wall_seconds=60.0, cpu_seconds=1))
    assert result.status == "cpu_limit"
    assert result.seconds < 30.0


def test_the_program_sees_no_network_but_loopback_where_unshare_works() -> None:
    if not network_isolation():
        pytest.skip("unshare cannot make a network namespace here (the audit hook refuses sockets)")
    result = run_python("print(open('/proc/net/dev').read())", LIMITS)
    interfaces = {line.split(":")[0].strip() for line in result.stdout.splitlines()[2:] if line}
    assert interfaces == {"lo"}
