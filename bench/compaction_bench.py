"""Compaction benchmark: SSO compaction of thousands of small Stream Set Objects under a memory
limit, and cold fetches of the same streams before and after it.

Runs against a SeaweedFS ``weed mini`` it starts on loopback (default) or a local directory
(``--store file``). One node (file WAL, SQLite metadata) writes ``--streams`` streams; each of
``--ssos`` rounds appends one ``--batch-bytes`` batch to every stream and ``force_upload()``s it,
so every round is one small Stream Set Object holding one block per stream.

    python bench/compaction_bench.py [--ssos 2000] [--streams 200] [--cache-mib 8] [--quick]

Figures:
* cold fetch (caches dropped) of ``--sample`` streams from offset 0 to their end, 1 MiB per
  read: p50/p99 per stream and the GETs issued, before and after compaction; the data read
  after must be byte-identical to the data read before;
* the compaction of all the node's SSOs with the units of ``storage/compaction`` (index reads,
  plan, ``compact_stream_set_objects`` in a thread, commit): MB compacted, wall time and MB/s,
  peak memory the unit allocated (tracemalloc) against the limit, GETs one per block vs with
  adjacent blocks merged, PUT / multipart requests, objects before and after.

The unit runs under tracemalloc, which slowed it about 2.8x on the 2-core machine the figures
in bench/README.md come from: its MB/s is a lower bound. There the defaults take about 7 minutes
(compaction ~5, building ~2, cold reads before compaction ~1.5) and ``--quick`` under 2.
Ctrl-C stops SeaweedFS and removes the temporary directories.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage.compaction.analyzer import CompactionPlan, SourceObject, plan_compaction
from storage.compaction.units import (
    CompactionResult,
    IndexReadUnit,
    SSOCompactionUnit,
    StoreSpec,
    compact_stream_set_objects,
    read_indexes,
)
from storage.config import MiB, S3StreamConfig
from storage.metadata.model import ObjectState, S3ObjectMetadata
from storage.s3_storage import S3Storage
from storage.stream import StreamClient
from tests.support.seaweedfs import BENCH_VOLUME_SIZE_LIMIT_MB, SeaweedFS

T = TypeVar("T")
U = TypeVar("U")

FETCH_MAX_BYTES = MiB  # max.partition.fetch.bytes default
MIN_DATA_RATIO = 10  # data compacted / memory limit
FIXED_OVERHEAD_MIB = 4  # "a few MiB" of bookkeeping, besides the client and the part buffers
Read = tuple[int, int, bytes]  # (base offset, count, payload) of a batch read back


@dataclass
class ColdFetch:
    latencies: list[float]
    gets: int
    bytes_get: int
    lookup_seconds: float  # in the metadata's get_objects
    data: dict[int, list[Read]] = field(repr=False)

    @property
    def bytes(self) -> int:
        return sum(len(p) for reads in self.data.values() for _, _, p in reads)


@dataclass
class Compaction:
    sources: int
    plan: CompactionPlan
    result: CompactionResult
    index_seconds: float
    seconds: float
    peak: int
    baseline: int  # peak of a unit that only opens the store and reads one index
    rss_growth: int | None


def properties(root: Path, data_url: str, args: argparse.Namespace) -> dict[str, str]:
    return {
        "node.id": "1",
        "cluster.id": "compaction-bench",
        "s3.data.buckets": data_url,
        "metadata.store.url": f"sqlite:///{root}/metadata.db",
        "s3.wal.path": str(root / "wal"),
        "s3.wal.capacity": str(256 * MiB),
        "s3.wal.cache.size": str(128 * MiB),
        "s3.wal.upload.threshold": str(64 * MiB),
        "s3.wal.upload.interval.ms": str(24 * 3_600_000),  # only force_upload() uploads
        "s3.object.part.size": str(args.part_mib * MiB),
        "s3.stream.set.object.compaction.cache.size": str(int(args.cache_mib * MiB)),
        "s3.stream.set.object.compaction.stream.split.size": str(int(args.split_mib * MiB)),
    }


def pct(values: list[float], p: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


async def in_thread(fn: Callable[[U], T], arg: U) -> T:
    """``fn(arg)`` in a daemon thread (a unit runs its own event loop). Unlike
    ``asyncio.to_thread`` an interrupted bench does not wait at exit for the unit to finish."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        def apply() -> None:
            if not done.done():  # else the awaiting task was cancelled
                outcome()

        with contextlib.suppress(RuntimeError):  # the loop is closed: the bench was interrupted
            loop.call_soon_threadsafe(apply)

    def work() -> None:
        try:
            result = fn(arg)
        except BaseException as e:  # handed to the awaiting task
            error = e
            settle(lambda: done.set_exception(error))
        else:
            settle(lambda: done.set_result(result))

    threading.Thread(target=work, name=f"unit-{fn.__name__}", daemon=True).start()
    return await done


def rss_reset() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False where not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def rss_field(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(name)


# -- phases -----------------------------------------------------------------------------------


async def build(storage: S3Storage, streams: int, rounds: int, batch_bytes: int) -> list[int]:
    """``rounds`` rounds of one batch per stream, each uploaded as one Stream Set Object."""
    client = StreamClient(storage)
    opened = [await client.create_and_open() for _ in range(streams)]
    for _ in tqdm(range(rounds), desc="build SSOs", unit="SSO", file=sys.stderr):
        await asyncio.gather(*(s.append(os.urandom(batch_bytes), 1) for s in opened))
        await storage.force_upload()
    return [s.stream_id for s in opened]


async def cold_fetch(storage: S3Storage, stream_ids: list[int], label: str) -> ColdFetch:
    """Read each stream from offset 0 to its end, 1 MiB per call, after dropping the caches."""
    storage.drop_cache()
    before = storage.store.stats.snapshot()
    latencies: list[float] = []
    data: dict[int, list[Read]] = {}
    metadata = storage.metadata
    get_objects = metadata.get_objects
    lookup = 0.0

    def timed_get_objects(
        stream_id: int, start_offset: int, end_offset: int, limit: int
    ) -> list[S3ObjectMetadata]:
        nonlocal lookup
        t = time.perf_counter()
        try:
            return get_objects(stream_id, start_offset, end_offset, limit)
        finally:
            lookup += time.perf_counter() - t

    setattr(metadata, "get_objects", timed_get_objects)  # noqa: B010 -- time the lookups
    try:
        for stream_id in tqdm(stream_ids, desc=label, unit="stream", leave=False, file=sys.stderr):
            end = storage.confirmed_offset(stream_id)
            reads: list[Read] = []
            pos = 0
            t0 = time.perf_counter()
            while pos < end:
                batches = await storage.read(stream_id, pos, end, FETCH_MAX_BYTES)
                if not batches or batches[-1].last_offset <= pos:
                    raise AssertionError(f"stream {stream_id}: read at {pos} of {end}: nothing")
                reads += [(b.base_offset, b.count, bytes(b.payload)) for b in batches]
                pos = batches[-1].last_offset
            latencies.append(time.perf_counter() - t0)
            data[stream_id] = reads
    finally:
        delattr(metadata, "get_objects")  # the class's method again
    after = storage.store.stats.snapshot()
    return ColdFetch(
        latencies,
        after["get"] - before["get"],
        after["bytes_get"] - before["bytes_get"],
        lookup,
        data,
    )


def object_counts(storage: S3Storage) -> tuple[int, int]:
    """(committed Stream Set Objects of this node, Stream Objects of every stream)."""
    image = storage.metadata.image
    node = image.nodes.get(storage.node_id)
    ssos = [
        s
        for s in (node.stream_set_objects if node is not None else ())
        if (o := image.objects.get(s.object_id)) is not None and o.state is ObjectState.COMMITTED
    ]
    return len(ssos), sum(len(s.stream_objects) for s in image.streams.values())


async def compact(storage: S3Storage, split_size: int, cache_size: int) -> Compaction:
    """Compact every SSO of the node: read indexes, plan, run the unit, commit."""
    config = storage.config
    spec = StoreSpec.from_config(config)
    image = storage.metadata.image
    node = image.nodes[storage.node_id]
    committed = [
        s
        for s in node.stream_set_objects
        if (o := image.objects.get(s.object_id)) is not None and o.state is ObjectState.COMMITTED
    ]
    t0 = time.perf_counter()
    indexes = await in_thread(
        read_indexes, IndexReadUnit(spec, tuple((s.object_id, s.object_size) for s in committed))
    )
    index_seconds = time.perf_counter() - t0
    sources = [
        SourceObject(s.object_id, s.object_size, s.order_id, s.data_time_ms, indexes[s.object_id])
        for s in committed
    ]
    del indexes
    plan = plan_compaction(
        sources,
        {sid: s.start_offset for sid, s in image.streams.items()},
        split_size=split_size,
        cache_size=cache_size,
    )
    if plan is None:
        raise AssertionError(f"nothing to compact in {len(sources)} stream set objects")
    first = await storage.metadata.prepare_object(plan.object_count, config.object_prepare_ttl_ms)
    unit = SSOCompactionUnit(spec, plan, first, {sid: s.epoch for sid, s in image.streams.items()})
    # what any unit costs before its own work: the store's client (botocore loads its models)
    tracemalloc.start()
    try:
        first_sso = committed[0]
        await in_thread(
            read_indexes, IndexReadUnit(spec, ((first_sso.object_id, first_sso.object_size),))
        )
        _, baseline = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_ok = rss_reset()
    rss_base = rss_field("VmRSS") if rss_ok else 0
    print(
        f"compacting {len(sources)} SSOs ({mb(plan.read_bytes)}) in {len(plan.iterations)} "
        f"iterations of <= {mib(cache_size)} ...",
        file=sys.stderr,
    )
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        result = await in_thread(compact_stream_set_objects, unit)
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_growth = rss_field("VmHWM") - rss_base if rss_ok else None
    await storage.metadata.commit_stream_set_object(
        storage.node_id,
        storage.node_epoch,
        result.object_id,
        min(s.order_id for s in sources),
        result.object_size,
        result.ranges,
        result.stream_objects,
        plan.compacted_object_ids,
    )
    return Compaction(
        len(sources), plan, result, index_seconds, seconds, peak, baseline, rss_growth
    )


def check_identical(before: ColdFetch, after: ColdFetch) -> None:
    for stream_id, want in before.data.items():
        got = after.data.get(stream_id)
        if got != want:
            first = next(
                (i for i, (a, b) in enumerate(zip(want, got or [], strict=False)) if a != b),
                min(len(want), len(got or [])),
            )
            raise SystemExit(
                f"FAILED: stream {stream_id} reads back differently after compaction: "
                f"{len(want)} batches before, {len(got or [])} after, first difference at "
                f"batch {first}"
            )


# -- report -----------------------------------------------------------------------------------


def print_fetch(label: str, f: ColdFetch) -> None:
    n = len(f.latencies)
    print(
        f"cold fetch {label:<6}: {n} streams of {mb(f.bytes / n)}: p50 "
        f"{pct(f.latencies, 50) * 1e3:8.1f} ms  p99 {pct(f.latencies, 99) * 1e3:8.1f} ms per "
        f"stream; {f.gets} GETs ({f.gets / n:.0f} per stream), {mb(f.bytes_get)} downloaded; "
        f"{f.lookup_seconds / sum(f.latencies):.0%} of the time in metadata lookups"
    )


def print_compaction(c: Compaction, cache_size: int, part_size: int, store: str) -> bool:
    """Print the compaction figures; True if the peak stays within the expected bound."""
    plan, result = c.plan, c.result
    req = result.requests
    largest = max([result.object_size, *(so.object_size for so in result.stream_objects)])
    if store == "file":  # no multipart: an upload keeps the whole object until finish
        upload, what = largest, "the largest new object whole: the file store has no parts"
    else:  # the part being filled, and its joined copy while it is sent
        upload = 2 * min(part_size, largest)
        what = f"2 x min(part {mib(part_size)}, largest new object {mib(largest)})"
    # fixed: whatever the data, a unit pays for its S3 client and its part buffers
    bound = cache_size + upload + c.baseline + FIXED_OVERHEAD_MIB * MiB
    within = c.peak <= bound
    print(
        f"compaction: {c.sources} SSOs, {mb(plan.read_bytes)} read, {mb(result.written_bytes)} "
        f"written, in {len(plan.iterations)} iterations; indexes {c.index_seconds:.1f} s "
        f"({c.sources} objects)"
    )
    print(
        f"compaction unit: {c.seconds:.1f} s, {plan.read_bytes / c.seconds / 1e6:.1f} MB/s "
        "(tracemalloc on)"
    )
    print(
        f"memory: limit {mib(cache_size)}, unit peak (tracemalloc) {mib(c.peak)} = limit + "
        f"{mib(c.peak - cache_size)} ({c.peak / cache_size:.1f}x the limit)"
        + (f"; RSS high-water growth {mib(c.rss_growth)}" if c.rss_growth is not None else "")
    )
    rest = c.peak - cache_size - upload - c.baseline
    print(
        f"memory over the limit: upload buffers {mib(upload)} ({what}), bare unit "
        f"{mib(c.baseline)} (store client: a unit reading one index), rest {mib(rest)} "
        f"(bookkeeping; {len(plan.iterations)} iterations of "
        f"~{plan.block_count // len(plan.iterations)} blocks from "
        f"~{plan.get_count // len(plan.iterations)} ranges)"
    )
    print(
        f"memory bound: limit + upload buffers + bare unit + {FIXED_OVERHEAD_MIB} MiB = "
        f"{mib(bound)}: " + ("within" if within else f"EXCEEDED by {mib(c.peak - bound)}")
    )
    print(
        f"GETs: {plan.block_count} one per block, {plan.get_count} with adjacent blocks merged "
        f"(planned), {req.get('get', 0)} issued "
        f"({plan.block_count / max(req.get('get', 0), 1):.1f}x fewer)"
    )
    print(
        f"writes: {req.get('put', 0)} PutObject, {req.get('multipart_create', 0)} multipart "
        f"uploads of {req.get('part', 0)} parts ({req.get('multipart_complete', 0)} completed)"
    )
    return within


def print_table(
    args: argparse.Namespace,
    data_bytes: int,
    objects_before: tuple[int, int],
    objects_after: tuple[int, int],
    before: ColdFetch,
    after: ColdFetch,
    c: Compaction,
    cache_size: int,
    part_size: int,
) -> None:
    req = c.result.requests
    n = len(before.latencies)
    rows = [
        ("data (payload)", f"{mb(data_bytes)} = {data_bytes / cache_size:.1f}x the limit", ""),
        (
            "objects (SSO + SO)",
            f"{sum(objects_before)} ({objects_before[0]} + {objects_before[1]})",
            f"{sum(objects_after)} ({objects_after[0]} + {objects_after[1]})",
        ),
        (
            f"cold fetch p50 / p99 per stream ({n} streams)",
            f"{pct(before.latencies, 50) * 1e3:.0f} / {pct(before.latencies, 99) * 1e3:.0f} ms",
            f"{pct(after.latencies, 50) * 1e3:.0f} / {pct(after.latencies, 99) * 1e3:.0f} ms",
        ),
        ("cold fetch GETs per stream", f"{before.gets / n:.0f}", f"{after.gets / n:.0f}"),
        (
            "cold fetch MB downloaded",
            f"{before.bytes_get / 1e6:.1f}",
            f"{after.bytes_get / 1e6:.1f}",
        ),
        ("compaction read / written", f"{mb(c.plan.read_bytes)}", f"{mb(c.result.written_bytes)}"),
        (
            "compaction time, MB/s",
            f"{c.seconds:.1f} s (+ {c.index_seconds:.1f} s indexes)",
            f"{c.plan.read_bytes / c.seconds / 1e6:.1f} MB/s",
        ),
        (
            "memory limit / peak traced",
            mib(cache_size),
            f"{mib(c.peak)} (limit + {mib(c.peak - cache_size)})",
        ),
        ("peak of a bare unit (store client)", "", mib(c.baseline)),
        (
            "compaction GETs: per block / merged",
            f"{c.plan.block_count}",
            f"{req.get('get', 0)} (planned {c.plan.get_count})",
        ),
        (
            "compaction PUT / multipart (parts)",
            f"{req.get('put', 0)}",
            f"{req.get('multipart_create', 0)} ({req.get('part', 0)})",
        ),
    ]
    print()
    print(
        f"| {args.ssos} SSOs x {args.streams} streams x {args.batch_bytes} B, "
        f"store {args.store}, part {mib(part_size)} | before | after |"
    )
    print("|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a} | {b} |")


# -- main -------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument(
        "--store",
        choices=("s3", "file"),
        default="s3",
        help="s3: SeaweedFS on loopback (default); file: a local directory",
    )
    parser.add_argument("--streams", type=int, default=200, help="streams written (default 200)")
    parser.add_argument(
        "--ssos", type=int, default=None, help="rounds, one SSO each (default 2000, --quick 300)"
    )
    parser.add_argument(
        "--batch-bytes", type=int, default=256, help="payload bytes of each batch (default 256)"
    )
    parser.add_argument(
        "--cache-mib",
        type=float,
        default=None,
        help="compaction memory limit, MiB (default 8, --quick 1)",
    )
    parser.add_argument(
        "--split-mib",
        type=float,
        default=8.0,
        help="a stream run this large leaves the SSO as a Stream Object, MiB (default 8)",
    )
    parser.add_argument(
        "--part-mib", type=int, default=16, help="s3.object.part.size, MiB (default 16)"
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=None,
        help="streams read by each cold fetch (default 5, --quick 20: before compaction a "
        "stream of 2000 SSOs takes ~25 s to read here)",
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=int(os.environ.get("AUTOMQ_BENCH_S3_BASE_PORT", 18700)),
        help="SeaweedFS base port: 9 ports from it and +10008 "
        "(default 18700, or $AUTOMQ_BENCH_S3_BASE_PORT)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 300 SSOs, 1 MiB limit")
    args = parser.parse_args()
    if args.ssos is None:
        args.ssos = 300 if args.quick else 2000
    if args.sample is None:
        args.sample = 20 if args.quick else 5
    if args.cache_mib is None:
        args.cache_mib = 1.0 if args.quick else 8.0
    if min(args.streams, args.ssos, args.batch_bytes, args.sample) < 1 or args.cache_mib <= 0:
        parser.error("--streams, --ssos, --batch-bytes, --sample and --cache-mib must be positive")
    args.sample = min(args.sample, args.streams)
    data = args.ssos * args.streams * args.batch_bytes
    if data < MIN_DATA_RATIO * args.cache_mib * MiB:
        parser.error(
            f"{args.ssos} x {args.streams} x {args.batch_bytes} B = {mb(data)} is below "
            f"{MIN_DATA_RATIO}x the {args.cache_mib} MiB limit: raise --ssos or lower --cache-mib"
        )
    return args


async def run(args: argparse.Namespace) -> int:
    cache_size = int(args.cache_mib * MiB)
    part_size = args.part_mib * MiB
    data_bytes = args.ssos * args.streams * args.batch_bytes
    with tempfile.TemporaryDirectory(prefix="automq-compaction-bench-") as tmp:
        root = Path(tmp)
        server: SeaweedFS | None = None
        try:
            if args.store == "s3":
                server = SeaweedFS(
                    root / "s3",
                    base_port=args.base_port,
                    volume_size_limit_mb=BENCH_VOLUME_SIZE_LIMIT_MB,
                )
                server.start()
                data_url = server.url()
            else:
                (root / "objects").mkdir()
                data_url = f"file://{root / 'objects'}"
            (root / "node").mkdir()
            config = S3StreamConfig.from_properties(properties(root / "node", data_url, args))
            storage = await S3Storage.start(config)
            ok = False
            try:
                print(
                    f"# compaction bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} "
                    f"cores, store {args.store}: {args.ssos} SSOs x {args.streams} streams x "
                    f"{args.batch_bytes} B = {mb(data_bytes)} of payload, "
                    f"{data_bytes / cache_size:.1f}x the {mib(cache_size)} memory limit"
                )
                t0 = time.perf_counter()
                stream_ids = await build(storage, args.streams, args.ssos, args.batch_bytes)
                build_seconds = time.perf_counter() - t0
                step = len(stream_ids) / args.sample
                sample = [stream_ids[int(i * step)] for i in range(args.sample)]
                objects_before = object_counts(storage)
                print(
                    f"built: {objects_before[0]} SSOs + {objects_before[1]} SOs, "
                    f"{storage.store.stats.put} PutObject, in {build_seconds:.0f} s"
                )
                before = await cold_fetch(storage, sample, "cold fetch before")
                print_fetch("before", before)
                c = await compact(storage, int(args.split_mib * MiB), cache_size)
                within = print_compaction(c, cache_size, part_size, args.store)
                objects_after = object_counts(storage)
                print(
                    f"objects: {objects_before[0]} SSOs + {objects_before[1]} SOs -> "
                    f"{objects_after[0]} SSOs + {objects_after[1]} SOs"
                )
                after = await cold_fetch(storage, sample, "cold fetch after")
                print_fetch("after", after)
                check_identical(before, after)
                print(
                    f"check: {len(sample)} streams, {mb(after.bytes)} read back byte-identical "
                    "after compaction"
                )
                print_table(
                    args,
                    data_bytes,
                    objects_before,
                    objects_after,
                    before,
                    after,
                    c,
                    cache_size,
                    part_size,
                )
                if not within:
                    print(
                        "\nWARNING: the compaction's peak memory is above limit + upload buffers "
                        f"+ bare unit + {FIXED_OVERHEAD_MIB} MiB (see above)"
                    )
                ok = True
            finally:
                if ok:
                    await storage.close()
                else:
                    await storage.abort()
        finally:
            if server is not None:
                server.stop()
    return 0


async def run_until_interrupted(args: argparse.Namespace) -> int:
    """``run``, cancelled (so that it cleans up) on Ctrl-C.

    The loop's own signal handler, not Python's default KeyboardInterrupt: that one runs only
    when the main thread executes bytecode, which a compaction thread can hold off for minutes.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            # a unit thread left running dies with the process; its retries need not be shown
            logging.disable(logging.WARNING)
            task.cancel()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        return await run(args)
    except asyncio.CancelledError:
        if not interrupted:
            raise
        print("interrupted: SeaweedFS stopped, temporary directories removed", file=sys.stderr)
        return 130
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def main() -> int:
    args = parse_args()
    try:
        return asyncio.run(run_until_interrupted(args))
    except KeyboardInterrupt:  # before the handler is in place
        return 130


if __name__ == "__main__":
    sys.exit(main())
