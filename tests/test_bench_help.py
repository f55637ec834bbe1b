"""Every bench is a command with ``--help`` that starts: its imports of the project's and the
test support's helpers still resolve (a helper moved without its callers fails here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
COMMANDS = sorted(p for p in BENCH.glob("*.py") if "argparse" in p.read_text())


@pytest.mark.parametrize("script", COMMANDS, ids=lambda p: p.name)
def test_the_bench_prints_its_help(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
