"""Storage benchmark: prints append, hot/cold fetch throughput and S3 requests per GiB.

Runs against a real S3 server: a SeaweedFS ``weed mini`` it starts on loopback (default) or
``--s3-url``. Each scenario uses a fresh node (file WAL with fsync, SQLite metadata).

    python bench/storage_bench.py [--append-mib 256] [--puts-mib 512]

Figures:
* append MB/s and p50/p99 latency, 1 KiB and 64 KiB batches, 64 concurrent appenders, every
  acknowledgement after the WAL fsync;
* hot fetch MB/s (LogCache) and cold fetch MB/s (objects, after the caches are dropped), with
  the GETs issued;
* S3 write requests per GiB written with 10 streams and with 1000 streams, same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage.config import MiB, S3StreamConfig
from storage.s3_storage import S3Storage
from storage.stream import S3Stream, StreamClient
from tests.support.seaweedfs import BENCH_VOLUME_SIZE_LIMIT_MB, SeaweedFS

WRITE_KINDS = ("put", "multipart_create", "part", "multipart_complete")


def properties(workdir: Path, s3_url: str, **extra: int) -> dict[str, str]:
    props = {
        "node.id": "1",
        "cluster.id": "bench",
        "s3.data.buckets": s3_url,
        "metadata.store.url": f"sqlite:///{workdir}/metadata.db",
        "s3.wal.path": str(workdir / "wal"),
        "s3.wal.capacity": str(2048 * MiB),
        "s3.wal.cache.size": str(1024 * MiB),
    }
    props.update({k: str(v) for k, v in extra.items()})
    return props


async def start(workdir: Path, s3_url: str, **extra: int) -> S3Storage:
    workdir.mkdir(parents=True, exist_ok=True)
    return await S3Storage.start(
        S3StreamConfig.from_properties(properties(workdir, s3_url, **extra))
    )


def pct(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100)[int(p) - 1] if len(values) > 1 else values[0]


async def write(
    streams: list[S3Stream], batch: int, total: int, concurrency: int, label: str
) -> tuple[float, list[float]]:
    """Append ``total`` bytes in ``batch``-byte appends, ``concurrency`` at a time, round-robin
    over ``streams``; return seconds taken and each append's latency."""
    payload = os.urandom(batch)
    n = total // batch
    latencies: list[float] = []
    bar = tqdm(total=n, desc=label, unit="batch", leave=False, file=sys.stderr)
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < n:
            i = next_index
            next_index += 1
            t = time.perf_counter()
            await streams[i % len(streams)].append(payload, 1)
            latencies.append(time.perf_counter() - t)
            bar.update()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    bar.close()
    return elapsed, latencies


async def read_all(streams: list[S3Stream], label: str) -> tuple[float, int]:
    total = 0
    bar = tqdm(total=len(streams), desc=label, unit="stream", leave=False, file=sys.stderr)
    t0 = time.perf_counter()
    for s in streams:
        pos = 0
        while pos < s.confirmed_offset:
            result = await s.fetch(pos, -1, MiB)  # max.partition.fetch.bytes default
            for b in result.batches:
                total += len(b.payload)
            pos = result.batches[-1].last_offset
        bar.update()
    bar.close()
    return time.perf_counter() - t0, total


async def append_and_fetch(root: Path, s3_url: str, batch: int, total: int) -> None:
    storage = await start(root / f"append-{batch}", s3_url)
    try:
        client = StreamClient(storage)
        streams = [await client.create_and_open() for _ in range(16)]
        elapsed, lat = await write(streams, batch, total, 64, f"append {batch // 1024} KiB")
        fsyncs = storage.wal.stats.fsyncs
        print(
            f"append  {batch // 1024:>3} KiB batches: {total / elapsed / 1e6:8.1f} MB/s "
            f"{len(lat) / elapsed:9.0f} appends/s  p50 {pct(lat, 50) * 1e3:6.2f} ms  "
            f"p99 {pct(lat, 99) * 1e3:6.2f} ms  ({len(lat)} appends, {fsyncs} fsyncs)"
        )
        if batch != 64 * 1024:
            return
        secs, got = await read_all(streams, "hot fetch")
        print(
            f"fetch hot  (LogCache)        : {got / secs / 1e6:8.1f} MB/s ({got >> 20} MiB, "
            "zero-copy: buffers handed out, not copied)"
        )
        await storage.force_upload()
        storage.drop_cache()
        gets = storage.store.stats.get
        secs, got = await read_all(streams, "cold fetch")
        print(
            f"fetch cold (S3, caches empty): {got / secs / 1e6:8.1f} MB/s ({got >> 20} MiB, "
            f"{storage.store.stats.get - gets} GETs)"
        )
    finally:
        await storage.close()


async def puts_per_gib(root: Path, s3_url: str, streams: int, total: int) -> float:
    storage = await start(root / f"puts-{streams}", s3_url)
    try:
        client = StreamClient(storage)
        opened = [await client.create_and_open() for _ in range(streams)]
        await write(opened, 16 * 1024, total, 64, f"{streams} streams")
        await storage.force_upload()
        stats = storage.store.stats.snapshot()
        requests = sum(stats[k] for k in WRITE_KINDS)
        per_gib = requests / (total / (1 << 30))
        print(
            f"S3 writes, {streams:>4} streams: {per_gib:7.1f} requests/GiB "
            f"({stats['put']} PutObject, {stats['multipart_create']} multipart uploads of "
            f"{stats['part']} parts; {storage.uploads} uploads of {total >> 20} MiB)"
        )
        return per_gib
    finally:
        await storage.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--s3-url", help="use this S3 (s3://bucket?endpoint=..) instead of weed")
    parser.add_argument("--append-mib", type=int, default=256, help="MiB per append scenario")
    parser.add_argument("--puts-mib", type=int, default=500, help="MiB per S3-requests scenario")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="automq-bench-") as tmp:
        root = Path(tmp)
        server = None
        s3_url = args.s3_url
        if s3_url is None:
            server = SeaweedFS(root / "s3", volume_size_limit_mb=BENCH_VOLUME_SIZE_LIMIT_MB)
            server.start()
            s3_url = server.url()
        try:
            print(f"# storage bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores")
            for batch in (1024, 64 * 1024):
                await append_and_fetch(root, s3_url, batch, args.append_mib * MiB)
            few = await puts_per_gib(root, s3_url, 10, args.puts_mib * MiB)
            many = await puts_per_gib(root, s3_url, 1000, args.puts_mib * MiB)
            print(f"S3 writes per GiB, 1000 vs 10 streams: {many / few:.3f}x")
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    asyncio.run(main())
