"""A real crash: SIGKILL a process appending to the WAL; every acknowledged record survives."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.wal import FileWAL, file_wal
from tests.storage.wal.crash_appender import body_for

REPO_ROOT = Path(__file__).resolve().parents[3]
APPENDER = Path(__file__).with_name("crash_appender.py")
CAPACITY = 256 * 1024

pytestmark = pytest.mark.timeout(60)


def run_and_kill(path: Path, first_seq: int, kill_after_lines: int, inline_max: int) -> list[str]:
    """Run the appender until it has printed ``kill_after_lines`` lines, SIGKILL it, and return
    every complete line it printed."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(APPENDER),
            str(path),
            str(CAPACITY),
            str(first_seq),
            str(inline_max),
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    lines: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(lines) < kill_after_lines and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()  # no-op if already dead; never leave the child behind
        rest = proc.stdout.read()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the appender died on its own"
    lines.extend(rest.splitlines(keepends=True))
    # a line cut by the kill has no newline: its append may not have been acknowledged yet
    return [line.decode() for line in lines if line.endswith(b"\n")]


@pytest.mark.parametrize(
    ("commits", "inline_max"),
    [
        # the ring's room left after a commit must exceed the loop's largest: with 256 KiB of
        # ring, every commit is the writer thread's
        ("thread", file_wal.INLINE_COMMIT_MAX),
        ("ring", 4096),  # the event loop's, through an io_uring
    ],
)
async def test_every_acknowledged_record_survives_sigkill(
    tmp_path: Path, commits: str, inline_max: int
) -> None:
    path = tmp_path / "wal"
    rng = random.Random()
    for round_ in range(3):
        lines = run_and_kill(path, round_ * 1_000_000, rng.randint(300, 3000), inline_max)
        if commits == "ring":
            assert lines[0] == "M ring\n"
        acked = [(int(f[1]), int(f[2])) for f in (ln.split() for ln in lines) if f[0] == "A"]
        trims = [int(f[1]) for f in (ln.split() for ln in lines) if f[0] == "T"]
        assert acked, "the appender acknowledged nothing"

        wal = await FileWAL.open(str(path), CAPACITY)
        records = {r.offset: bytes(r.body) for r in wal.recover()}
        assert wal.trim_offset >= max(trims, default=0)
        checked = 0
        for offset, seq in acked:
            if offset >= wal.trim_offset:
                assert records.get(offset) == body_for(seq), f"acked record at {offset} lost"
                checked += 1
        assert checked > 0
        await wal.close(clean=False)
