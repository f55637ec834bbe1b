"""The file WAL's appends beside busy cores: ``s3.wal.io.realtime`` on and off.

A file WAL (io_uring commits, a zero-filled ring of ``--wal-mib``) takes one ``--record-kib``
append every ``--interval-ms`` (the defaults: 20 MB/s in 128 KiB commits, the size of a burst of
librdkafka's requests at the bench's offered rate) for ``--seconds``, while ``--burners``
processes (2: one per core here) spin on the CPU as a broker's clients and neighbours would.
It prints each append's time from ``append()`` to its acknowledgement, p50/p90/p99/p99.9 and
the longest, with the io_uring's kernel workers at real-time priority and without, alternated
``--runs`` times. Each pass runs in a process of its own: the kernel's io_uring workers belong
to the thread that submits, and keep the priority they were given.

    .venv/bin/python bench/wal_appends.py
    .venv/bin/python bench/wal_appends.py --burners 0 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent


def burn(stop: Event) -> None:
    """Keep a core busy until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        for i in range(10_000):
            x += i


async def appends(args: argparse.Namespace, realtime: bool) -> dict[str, float]:
    """One pass: the appends' times, in ms, by percentile."""
    sys.path.insert(0, str(ROOT))
    from storage.wal import FileWAL

    work = tempfile.mkdtemp(prefix="automq-wal-appends-", dir=args.dir)
    try:
        wal = await FileWAL.open(
            os.path.join(work, "wal"), args.wal_mib << 20, init_zero=True, realtime_io=realtime
        )
        body = os.urandom(args.record_kib << 10)
        took: list[float] = []
        interval = args.interval_ms / 1000
        trimmed = 0
        try:
            due = time.monotonic()
            end = due + args.seconds
            while due < end:
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                started = time.perf_counter()
                result = await wal.append(body)
                took.append(time.perf_counter() - started)
                due = max(due + interval, time.monotonic() - interval)
                if result.offset - trimmed > (args.wal_mib << 20) // 4:
                    await wal.trim(result.offset)
                    trimmed = result.offset
            priority = wal.io_priority
            raised = priority.raised if priority is not None else 0
            refused = float(priority is not None and priority.refused is not None)
        finally:
            await wal.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    took.sort()
    n = len(took)
    figures = {f"p{q:g}": took[min(n - 1, int(n * q / 100))] * 1e3 for q in (50, 90, 99, 99.9)}
    figures.update(longest=took[-1] * 1e3, appends=n, raised=raised, refused=refused)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description="The file WAL's append times beside busy cores, s3.wal.io.realtime on/off.",
        epilog="See the module docstring (and bench/README.md) for what is measured.",
    )
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the WAL goes (/tmp)")
    parser.add_argument("--wal-mib", type=int, default=256, help="the WAL's capacity (256)")
    parser.add_argument("--record-kib", type=int, default=128, help="bytes per append, KiB (128)")
    parser.add_argument("--interval-ms", type=float, default=6.5, help="between appends (6.5)")
    parser.add_argument("--seconds", type=float, default=30.0, help="each pass (30)")
    parser.add_argument("--burners", type=int, default=2, help="busy processes beside it (2)")
    parser.add_argument("--runs", type=int, default=2, help="passes of each setting (2)")
    parser.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("wal_mib", "record_kib", "interval_ms", "seconds", "runs"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.burners < 0:
        parser.error("--burners must not be negative")
    if args.child is not None:
        print(json.dumps(asyncio.run(appends(args, args.child == "on"))))
        return 0

    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=burn, args=(stop,)) for _ in range(args.burners)]
    for p in burners:
        p.start()
    rows: list[tuple[str, dict[str, float]]] = []
    passes = [setting for _ in range(args.runs) for setting in ("on", "off")]
    try:
        for setting in tqdm(passes, desc="passes", unit="pass", file=sys.stderr):
            child = [sys.executable, __file__, "--child", setting]
            for name in ("dir", "wal_mib", "record_kib", "interval_ms", "seconds"):
                child += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
            out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
            rows.append((setting, json.loads(out.strip().splitlines()[-1])))
    finally:
        stop.set()
        for p in burners:
            p.join()
    print(
        f"# file WAL, {args.record_kib} KiB appends every {args.interval_ms} ms, {args.seconds:.0f}"
        f" s a pass, {args.burners} busy processes beside it, {os.cpu_count()} cores"
    )
    for setting, r in rows:
        note = " (refused: normal priority)" if r["refused"] else ""
        print(
            f"s3.wal.io.realtime={'true' if setting == 'on' else 'false'}: {r['appends']:.0f} "
            f"appends, p50 {r['p50']:.2f} ms, p90 {r['p90']:.2f}, p99 {r['p99']:.2f}, "
            f"p99.9 {r['p99.9']:.2f}, longest {r['longest']:.1f}; workers raised "
            f"{r['raised']:.0f}{note}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
