"""The Fetch path's CPU per request inside the broker, without sockets or clients.

A broker with its defaults (file WAL, local object store, SQLite metadata) runs in this process,
in a temporary directory. It takes ``--batches`` Produce requests per partition, each one batch
of ``--records`` records of ``--record-size`` bytes (a saturating librdkafka producer's batches
are ~700 KB), so that everything is in its LogCache; then Fetch requests in a sessionless
consumer's shape (v12, every partition from one offset, ``partition_max_bytes`` 1 MiB,
``min_bytes`` 1, ``--isolation-level`` 1: read_committed, librdkafka's default) are decoded,
handled and their responses encoded, one after the other, each from the next batch's offset.
Per run it prints the event loop's CPU per fetch (``thread_time``) and the response's size;
``--profile`` also prints the Python calls per fetch and the functions that took the most time,
under ``cProfile`` in a pass of its own.

What it leaves out is the socket: the response's copy into it and, on loopback, the receiver's
TCP work, which the sender's system call does. A consume's CPU per GB ("Measured facts" in
``bench/README.md``) is this figure plus that. ``--checkout`` runs other checkouts' code,
alternated with each other::

    .venv/bin/python bench/fetch_path.py
    .venv/bin/python bench/fetch_path.py --checkout /tmp/before --checkout . --runs 4
    .venv/bin/python bench/fetch_path.py --records 15 --profile --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WARMUP_FETCHES = 200  # the schemas loaded, the response build plans made


def main() -> int:
    parser = argparse.ArgumentParser(
        description="The broker's CPU per Fetch request in-process (no sockets, no client).",
        epilog="See the module docstring (and bench/README.md) for what is measured.",
    )
    parser.add_argument("--partitions", type=int, default=8, help="partitions fetched (8)")
    parser.add_argument(
        "--records", type=int, default=700, help="records per batch (700: ~700 KB batches)"
    )
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record (1024)")
    parser.add_argument("--batches", type=int, default=16, help="batches per partition (16)")
    parser.add_argument("--fetches", type=int, default=2000, help="measured fetches a run (2000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per checkout (3)")
    parser.add_argument(
        "--isolation-level",
        type=int,
        choices=(0, 1),
        default=1,
        help="the fetches' isolation_level: 1 read_committed (librdkafka's default), "
        "0 read_uncommitted (the Java client's)",
    )
    parser.add_argument(
        "--checkout",
        action="append",
        default=[],
        help="a checkout of automq-py whose code to run (repeatable: runs alternate between "
        "them); default: this one",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile the fetches (cProfile, a pass)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("partitions", "records", "record_size", "batches", "fetches", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.child:
        print(json.dumps(asyncio_run(measure(args))), flush=True)
        return 0
    checkouts = [Path(c).resolve() for c in args.checkout] or [Path(__file__).resolve().parents[1]]
    print(
        f"# {args.partitions} partitions a fetch, batches of {args.records} x "
        f"{args.record_size} B, isolation_level {args.isolation_level}, {args.fetches} fetches "
        f"a run after {WARMUP_FETCHES}"
    )
    figures: dict[Path, list[float]] = {c: [] for c in checkouts}
    for run in range(1, args.runs + 1):
        for checkout in checkouts:
            result = run_child(checkout, args)
            figures[checkout].append(result["cpu_us"])
            print(
                f"{checkout.name:>14} run {run}: loop CPU {result['cpu_us']:6.1f} us/fetch  "
                f"wall {result['wall_us']:6.1f} us/fetch  response {result['mb']:.2f} MB",
                flush=True,
            )
            if "profile" in result:
                print(result["profile"], flush=True)
    print("# loop CPU per fetch, median of the runs:")
    for checkout, values in figures.items():
        print(f"{checkout.name:>14}: {statistics.median(values):.1f} us ({checkout})")
    return 0


def run_child(checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run on ``checkout``'s code: this script again, with the checkout first on the path
    (``PYTHONSAFEPATH``: not this script's directory)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child"]
    for name in ("partitions", "records", "record_size", "batches", "fetches", "isolation_level"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.profile:
        command.append("--profile")
    env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONSAFEPATH="1")
    out = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"the run on {checkout} failed (exit code {out.returncode})")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def asyncio_run(main_coroutine: Any) -> Any:
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main_coroutine)


def fetch_request(
    topic: str, partitions: int, offset: int, correlation_id: int, isolation_level: int
) -> bytes:
    """A Fetch v12 request (header and body) of every partition from ``offset``, without a
    fetch session (librdkafka's shape)."""
    from kafka.protocol.consumer import FetchRequest

    fetched = [
        FetchRequest.FetchTopic.FetchPartition(
            partition=p, fetch_offset=offset, partition_max_bytes=1 << 20
        )
        for p in range(partitions)
    ]
    request = FetchRequest[12](
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=52428800,
        isolation_level=isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=fetched)],
        forgotten_topics_data=[],
        rack_id="",
    )
    request.with_header(correlation_id=correlation_id, client_id="fetch-path")
    return bytes(request.encode(header=True))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    # this script's neighbour, whichever checkout's code the run imports (PYTHONPATH)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from produce_path import in_process_broker, split_frames

    from automq_py.apis.deferred import PendingResponse
    from bench.produce_requests import TOPIC, encoded_burst
    from protocol.messages import decode_request

    async with in_process_broker("automq-fetch-path-") as broker:
        apis = broker.server.apis
        await apis.ctx.topics.create(TOPIC, args.partitions)
        produce = split_frames(encoded_burst(args.partitions, args.records, args.record_size))
        for _ in range(args.batches):
            requests = [
                decode_request(memoryview(bytearray(frame)), apis.supported) for frame in produce
            ]
            pending = await apis.handle_produce_batch(requests)
            broker.storage.commit_now()
            for response in pending:
                if isinstance(response, PendingResponse):
                    if not response.future.done():
                        await response.future
                    response.response()
        fetches = [
            fetch_request(TOPIC, args.partitions, k * args.records, k, args.isolation_level)
            for k in range(args.batches)
        ]
        sizes: list[int] = []

        async def fetch(frame: bytes) -> None:
            out = await apis.handle(decode_request(frame, apis.supported))
            if isinstance(out, PendingResponse):
                if not out.future.done():
                    await out.future
                out = out.response()
            assert out is not None
            sizes.append(sum(len(b) for b in out))

        for i in range(WARMUP_FETCHES):
            await fetch(fetches[i % len(fetches)])
        gc.collect()
        cpu, wall = time.thread_time(), time.perf_counter()
        for i in range(args.fetches):
            await fetch(fetches[i % len(fetches)])
        result: dict[str, Any] = {
            "cpu_us": (time.thread_time() - cpu) / args.fetches * 1e6,
            "wall_us": (time.perf_counter() - wall) / args.fetches * 1e6,
            "mb": statistics.median(sizes) / 1e6,
        }
        if args.profile:
            import cProfile
            import io
            import pstats

            profile = cProfile.Profile()
            passes = max(args.fetches // 4, 1)
            profile.enable()
            for i in range(passes):
                await fetch(fetches[i % len(fetches)])
            profile.disable()
            text = io.StringIO()
            stats = pstats.Stats(profile, stream=text)
            calls = stats.total_calls / passes  # type: ignore[attr-defined]
            text.write(f"{calls:.0f} Python calls a fetch\n")
            stats.sort_stats("tottime").print_stats(20)
            result["profile"] = text.getvalue()
        return result


if __name__ == "__main__":
    sys.exit(main())
