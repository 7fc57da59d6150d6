"""Fuzz of the two validating entry points (issue 12): no traceback, no hang, no memory blow-up.

In-process cases from tests/support/fuzz.py (seeded; each case limited to a few seconds, the whole run
to about 15 s), plus a few subprocess runs that check the exit codes a shell sees. The full run:
`python -m tests.support.fuzz --cases 10000`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import fuzz

ROOT = Path(__file__).resolve().parents[2]


def test_fuzzed_inputs_never_crash_or_hang() -> None:
    problems: list[str] = []
    counts = fuzz.fuzz(2000, seed=2026, timeout=5.0, budget=15.0,
                       on_problem=lambda i, case, outcome, detail: problems.append(f"case {i} ({case.target}): "
                                                                                   f"{outcome}: {detail}"))
    assert not problems, problems[:5]
    assert counts["clean"] > 50 and counts["accepted"] > 5, counts  # the generator reaches both outcomes


@pytest.mark.parametrize("target, text, code", [
    ("rljob", (ROOT / "examples" / "rljob_cpu_tiny.yaml").read_text(), 0),
    ("rljob", "apiVersion: rl.hybridflow.dev/v1alpha1\nkind: RLJob\nmetadata: {name: x}\nspec: {}\n", 1),
    ("rljob", "a: " + "[" * 600 + "]" * 600, 3),
    ("config", "trainer: {nnodes: !!float abc}\n", 2),
    ("config", "a: 1\na: 2\n", 2),
])
def test_exit_codes_as_a_shell_sees_them(tmp_path: Path, target: str, text: str, code: int) -> None:
    path = tmp_path / "input.yaml"
    path.write_text(text)
    command = ["-m", "rljob_operator.cli", "validate", "-f"] if target == "rljob" else ["-m", "hybridflow.config"]
    args = [str(path)] if target == "rljob" else [str(path), "--for-run"]
    result = subprocess.run([sys.executable, *command, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == code, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
