"""The `python_tests` answer format: an output's answer is its last ```python block, and it is
right when the gold answer's tests (assert statements) pass against it in the Python tool's
sandbox (grpo_core/data/python_sandbox.py), as code tasks verify (the R1 line, NeMo-RL)."""

from __future__ import annotations

import re

from grpo_core.data.python_sandbox import SandboxLimits, run_python

_BLOCK = re.compile(r"```python[ \t]*\n(.*?)```", re.DOTALL)
# What one check may use: a program and its tests run in well under a second.
TEST_LIMITS = SandboxLimits(wall_seconds=3.0, cpu_seconds=2, memory_mb=512, output_bytes=65536)


def last_python_block(completion: str) -> str | None:
    """The code of the output's last closed ```python block; None without one."""
    blocks = _BLOCK.findall(completion)
    return blocks[-1] if blocks and blocks[-1].strip() else None


def passes_tests(tests: str, program: str) -> bool:
    """Whether `program` followed by `tests` runs to the end in the sandbox."""
    return run_python(f"{program}\n\n{tests}\n", TEST_LIMITS).ok


def canonical_program(program: str) -> str:
    """The key majority voting groups programs by: their lines without blank lines, comments
    or trailing spaces (programs that differ otherwise count as different answers)."""
    lines = (line.split("#", 1)[0].rstrip() for line in program.strip().splitlines())
    return "\n".join(line for line in lines if line.strip())


def check_tests(tests: str) -> str | None:
    """None when the gold tests compile and assert something, else what is wrong."""
    try:
        compile(tests, "<tests>", "exec")
    except SyntaxError as exc:
        return f"its tests are not valid Python ({exc.msg}, line {exc.lineno})"
    return None if "assert" in tests else "its tests hold no assert statement"


def ends_with_program(completion: str) -> float:
    """1.0 when the output ends with a closed ```python block (nothing after it), else 0.0."""
    matches = list(_BLOCK.finditer(completion))
    if not matches or not matches[-1].group(1).strip():
        return 0.0
    return 1.0 if not completion[matches[-1].end() :].strip() else 0.0
