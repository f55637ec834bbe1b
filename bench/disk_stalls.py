"""The disk's stalls: do durable writes to different files stall together?

The file WAL's acknowledgements wait for one ``O_DSYNC`` write at a time, and a write the disk
holds for tens of milliseconds sets a case's p99.9 (``bench/README.md``, "The disk's stalls").
A second WAL file could hedge a stalled write only if the disk holds writes one at a time, not
all at once. This probe tells which: ``--files`` threads each write ``--write-kib`` blocks with
``O_DSYNC`` into a file of their own (preallocated and written with zeros first, as the WAL's
``s3.wal.init.zero`` does, so every write overwrites written blocks), in turn, every
``--interval-ms`` between them (the defaults: 20 MB/s in all, the bench's offered rate), from
``--settle-s`` after the zero fill. No broker is involved.

A write that took ``--stall-ms`` or more is a stall. For each one the probe says how the other
files' writes fared meanwhile: *shared* when every write of another file that overlapped it was
held as long (give or take ``--stall-ms``), *alone* when another file's writes completed within
it. It prints each file's write time p50/p99/p99.9/longest, each stall, and how many were shared::

    .venv/bin/python bench/disk_stalls.py                      # 2 files, 120 s, under /tmp
    .venv/bin/python bench/disk_stalls.py --seconds 600 --dir /path/to/log.dirs
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from tqdm import tqdm

ZERO_CHUNK = 8 << 20  # bytes per write of the zero fill


@dataclass
class Writer:
    """One file's writes: (started, ended) in ``time.monotonic()`` seconds."""

    index: int
    path: str
    writes: list[tuple[float, float]] = field(default_factory=list)
    error: BaseException | None = None


def prepare(path: str, size: int, direct: bool) -> int:
    """The file, ``size`` bytes of zeros written and synced; an ``O_DSYNC`` descriptor of it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        zeros = bytes(ZERO_CHUNK)
        for offset in range(0, size, ZERO_CHUNK):
            os.pwrite(fd, zeros[: min(ZERO_CHUNK, size - offset)], offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    flags = os.O_RDWR | os.O_DSYNC | (getattr(os, "O_DIRECT", 0) if direct else 0)
    return os.open(path, flags)


def write_loop(
    writer: Writer, fd: int, block: memoryview, size: int, start: float, interval: float, end: float
) -> None:
    """Write ``block`` at ``start``, then every ``interval`` s until ``end``, laps over the file."""
    offset = 0
    due = start
    try:
        while True:
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            if due >= end:
                return
            t0 = time.monotonic()
            os.pwrite(fd, block, offset)
            writer.writes.append((t0, time.monotonic()))
            offset = (offset + len(block)) % (size - size % len(block))
            due = max(due + interval, time.monotonic())  # a held write is not caught up on
    except BaseException as e:  # reported by main
        writer.error = e


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def classify(
    stall: tuple[float, float], others: list[Writer], slack: float
) -> tuple[str, list[float]]:
    """``shared``, ``alone`` or ``unpaired`` (no other file wrote meanwhile), and the times (s)
    of the other files' writes that overlapped it."""
    t0, t1 = stall
    overlapping = [(a, b) for w in others for a, b in w.writes if a < t1 and b > t0]
    finished_inside = [(a, b) for a, b in overlapping if a >= t0 and b < t1 - slack]
    kind = "alone" if finished_inside else "shared" if overlapping else "unpaired"
    return kind, [b - a for a, b in overlapping]


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Do O_DSYNC writes to different files on one disk stall together?",
        epilog="See the module docstring (and bench/README.md) for what is measured.",
    )
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the files go (/tmp)")
    parser.add_argument("--files", type=int, default=2, help="files, a writer thread each (2)")
    parser.add_argument("--file-mib", type=int, default=256, help="size of each file (256)")
    parser.add_argument("--write-kib", type=int, default=128, help="bytes per write, KiB (128)")
    parser.add_argument(
        "--interval-ms", type=float, default=6.5, help="time between writes, all files (6.5)"
    )
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to write (120)")
    parser.add_argument("--stall-ms", type=float, default=30.0, help="a stall at least (30)")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=20.0,
        help="wait after the zero fill, whose write-back slows the disk's next writes (20)",
    )
    parser.add_argument("--direct", action="store_true", help="O_DIRECT as well as O_DSYNC")
    args = parser.parse_args()
    for name in ("files", "file_mib", "write_kib", "seconds", "interval_ms", "stall_ms"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.settle_s < 0:
        parser.error("--settle-s must not be negative")
    size = args.file_mib << 20
    block_size = args.write_kib << 10
    if block_size > size:
        parser.error("--write-kib is larger than --file-mib")

    block = memoryview(mmap.mmap(-1, block_size))  # page-aligned, as O_DIRECT wants
    block[:] = os.urandom(block_size)
    work = tempfile.mkdtemp(prefix="automq-disk-stalls-", dir=args.dir)
    writers = [Writer(i, os.path.join(work, f"wal-{i}")) for i in range(args.files)]
    fds: list[int] = []
    try:
        for w in tqdm(writers, desc="zero-filling", unit="file", leave=False, file=sys.stderr):
            fds.append(prepare(w.path, size, args.direct))
        time.sleep(args.settle_s)
        interval = args.interval_ms / 1000 * args.files  # each file's own interval
        start = time.monotonic() + 0.1
        end = start + args.seconds
        threads = [
            threading.Thread(
                target=write_loop,
                args=(w, fd, block, size, start + i * args.interval_ms / 1000, interval, end),
                name=f"writer-{i}",
                daemon=True,
            )
            for i, (w, fd) in enumerate(zip(writers, fds, strict=True))
        ]
        for t in threads:
            t.start()
        with tqdm(
            total=int(args.seconds), desc="writing", unit="s", leave=False, file=sys.stderr
        ) as bar:
            while any(t.is_alive() for t in threads):
                time.sleep(1.0)
                bar.n = min(int(args.seconds), max(0, int(time.monotonic() - start)))
                bar.refresh()
        for t in threads:
            t.join()
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(work, ignore_errors=True)
    for w in writers:
        if w.error is not None:
            print(f"file {w.index}: {w.error!r}", file=sys.stderr)
            return 1

    print(
        f"# {args.files} files of {args.file_mib} MiB under {args.dir}, {args.write_kib} KiB "
        f"O_DSYNC{' | O_DIRECT' if args.direct else ''} writes every {args.interval_ms} ms in "
        f"turn ({block_size / (args.interval_ms / 1000) / 1e6:.1f} MB/s), {args.seconds:.0f} s"
    )
    for w in writers:
        took = sorted(b - a for a, b in w.writes)
        print(
            f"file {w.index}: {len(took)} writes, p50 {percentile(took, 0.5) * 1e3:.2f} ms, "
            f"p99 {percentile(took, 0.99) * 1e3:.2f}, p99.9 {percentile(took, 0.999) * 1e3:.2f}, "
            f"longest {took[-1] * 1e3:.1f}"
        )
    slack = args.stall_ms / 1000
    stalls = sorted(
        (a, b, w) for w in writers for a, b in w.writes if b - a >= args.stall_ms / 1000
    )
    shared = 0
    seen: list[tuple[float, float]] = []
    for a, b, w in stalls:
        if any(a < y and b > x for x, y in seen):
            continue  # another file's stall over the same time, already reported
        seen.append((a, b))
        kind, overlapping = classify((a, b), [o for o in writers if o is not w], slack)
        shared += kind == "shared"
        others = ", ".join(f"{t * 1e3:.1f}" for t in overlapping[:6])
        print(
            f"stall at {a - writers[0].writes[0][0]:7.2f} s: file {w.index} held "
            f"{(b - a) * 1e3:.1f} ms; {kind}"
            + (f": the other files' overlapping writes took {others} ms" if others else "")
        )
    print(
        f"stalls of {args.stall_ms:.0f} ms or more: {len(seen)}, {shared} of them shared by "
        f"every file written meanwhile"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
