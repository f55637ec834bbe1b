"""The heap's pre-touch: buffers allocated after it reuse pages already mapped, in a process of
its own (the settings are the process's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from storage.heap import _available_memory

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20

# faults taken writing 48 MiB of new buffers (one write per page), after a pre-touch of 64 MiB
# or without one
CHILD = """
import json, resource, sys
from storage.heap import keep_large_buffers_in_heap, pretouch_heap
keep_large_buffers_in_heap()
touched = pretouch_heap(64 << 20) if sys.argv[1] == "on" else 0
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
buffers = [bytearray(16 << 20) for _ in range(3)]
for b in buffers:
    b[::4096] = b"x" * len(b[::4096])
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"touched": touched, "faults": faults}))
"""


def _run(mode: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], cwd=REPO, capture_output=True, text=True, check=True
    )
    result: dict[str, int] = json.loads(out.stdout)
    return result


def test_buffers_after_a_pretouch_take_no_page_faults() -> None:
    pages = 48 * MiB // 4096
    without = _run("off")
    assert without["touched"] == 0
    assert without["faults"] > pages // 2  # new pages: a fault each
    with_pretouch = _run("on")
    assert with_pretouch["touched"] == 64 * MiB
    assert with_pretouch["faults"] < pages // 10, with_pretouch


def test_available_memory_is_what_meminfo_allows_at_most() -> None:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            assert 0 < _available_memory() <= int(line.split()[1]) * 1024
