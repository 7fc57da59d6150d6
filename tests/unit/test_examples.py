"""Every example RLJob manifest passes `rljob validate` (the operator's own checks, offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rljob_operator import cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*rljob*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2, f"expected RLJob examples under {REPO / 'examples'}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_rljob_validate(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(["validate", "-f", str(path)])
    out = capsys.readouterr()
    assert status == 0, f"`rljob validate -f examples/{path.name}` failed:\n{out.out}{out.err}"
    assert ": valid" in out.out and "invalid" not in out.out
