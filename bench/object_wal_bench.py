"""Object WAL benchmark: append latency (submit to acknowledgement) at a modest fixed rate.

Starts a SeaweedFS ``weed mini`` on loopback (or uses ``--s3-url``), opens an ObjectWAL on it and
appends ``--size``-byte records at ``--rate`` appends/s for ``--seconds``, once per batch
interval in ``--intervals``; prints, per interval, p50/p99/max of the acknowledgement time, the
PUTs made and their p50/p99.

    python bench/object_wal_bench.py [--rate 1000] [--size 1024] [--intervals 0,2,5,10]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage.operator import open_object_store
from storage.wal.object_wal import ObjectWAL
from tests.support.seaweedfs import BENCH_VOLUME_SIZE_LIMIT_MB, SeaweedFS


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def run(url: str, interval_ms: int, rate: float, size: int, seconds: float) -> str:
    store = open_object_store(url)
    await store.connect()
    wal = await ObjectWAL.open(
        store,
        namespace=f"bench-{uuid.uuid4().hex[:8]}",
        node_id=1,
        node_epoch=1,
        capacity=1 << 34,
        batch_interval_ms=interval_ms,
        owns_store=True,
    )
    list(wal.recover())
    latencies: list[float] = []
    futures = []
    payload = bytes(size)
    started = time.perf_counter()
    count = int(rate * seconds)
    for i in range(count):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        submitted = time.perf_counter()
        future = wal.submit(payload)
        future.add_done_callback(lambda _f, t=submitted: latencies.append(time.perf_counter() - t))
        futures.append(future)
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - started
    await wal.trim(wal.next_offset)
    stats = wal.stats
    timings = wal.timing_summary()
    await wal.close()
    ms = [v * 1e3 for v in latencies]
    return (
        f"| {interval_ms} | {count / elapsed:.0f} | {pct(ms, 0.5):.1f} | {pct(ms, 0.99):.1f} |"
        f" {max(ms):.1f} | {stats.fsyncs / elapsed:.0f} | {timings.split(';')[0]} |"
    )


async def main(args: argparse.Namespace, url: str) -> None:
    print(f"{args.size}-byte appends at {args.rate:.0f}/s for {args.seconds:.0f} s each")
    print("| batch interval ms | appends/s | p50 ms | p99 ms | max ms | PUTs/s | PUT times |")
    print("|---|---|---|---|---|---|---|")
    for interval in args.intervals:
        print(await run(url, interval, args.rate, args.size, args.seconds), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="appends per second")
    parser.add_argument("--size", type=int, default=1024, help="bytes per append")
    parser.add_argument("--seconds", type=float, default=10.0, help="per batch interval")
    parser.add_argument(
        "--intervals",
        type=lambda text: [int(v) for v in text.split(",")],
        default=[0, 2, 5, 10],
        help="s3.wal.object.batch.interval.ms values to measure, comma-separated",
    )
    parser.add_argument("--s3-url", help="an s3:// url instead of a SeaweedFS started here")
    arguments = parser.parse_args()
    if arguments.s3_url:
        asyncio.run(main(arguments, arguments.s3_url))
    else:
        with (
            tempfile.TemporaryDirectory(prefix="object-wal-bench-") as workdir,
            SeaweedFS(
                Path(workdir) / "s3", volume_size_limit_mb=BENCH_VOLUME_SIZE_LIMIT_MB
            ) as server,
        ):
            asyncio.run(main(arguments, server.url()))
