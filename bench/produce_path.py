"""The Produce path's CPU per request inside the broker, without sockets or clients.

A broker with its defaults (file WAL, local object store, SQLite metadata) runs in this process,
in a temporary directory. Bursts of Produce requests in librdkafka's shape (one request per
partition, v9, ``acks=all``, one batch of ``--records`` records of ``--record-size`` bytes) are
decoded, handled as one append, committed to the WAL and answered (each response encoded), a
burst at a time, as the socket server does with the Produce requests it reads together (on a
checkout from before that, and in ``--phases``' own pass, handled one by one). Per run it
prints the event loop's CPU per request (``thread_time``: the work the broker's one loop thread
does, which the requests of a burst wait behind) and the wall time per request; ``--calls``
also counts the
Python function calls per request (under ``cProfile``, in a pass of its own), and ``--phases``
splits a request's time, in a pass of its own, into its decode, its handler up to the WAL submit
(what the burst's one commit waits behind) and its handler after it. ``--one-request`` sends
a burst's batches as one request of every partition (the Java client's shape), still counted per
batch: the difference is what the path costs per request rather than per batch.

Without the sockets, a client beside it and the host's scheduling, the figure spreads by a few
percent rather than ``produce_requests.py``'s ~15%: a change to the request path shows here
first. ``--checkout`` runs other checkouts' code, alternated with each other::

    .venv/bin/python bench/produce_path.py
    .venv/bin/python bench/produce_path.py --checkout /tmp/before --checkout . --runs 4
    .venv/bin/python bench/produce_path.py --calls --phases --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

WARMUP_BURSTS = 200  # the partitions' first appends, the schemas loaded, the WAL's first laps


def main() -> int:
    parser = argparse.ArgumentParser(
        description="The broker's CPU per Produce request in-process (no sockets, no client).",
        epilog="See the module docstring (and bench/README.md) for what is measured.",
    )
    parser.add_argument("--partitions", type=int, default=8, help="requests per burst (8)")
    parser.add_argument("--records", type=int, default=15, help="records per request (15)")
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record (1024)")
    parser.add_argument("--bursts", type=int, default=3000, help="measured bursts a run (3000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per checkout (3)")
    parser.add_argument(
        "--checkout",
        action="append",
        default=[],
        help="a checkout of automq-py whose code to run (repeatable: runs alternate between "
        "them); default: this one",
    )
    parser.add_argument(
        "--calls", action="store_true", help="also count Python function calls per request"
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="also time a request's decode and its handler before and after the WAL submit",
    )
    parser.add_argument(
        "--one-request",
        action="store_true",
        help="a burst's partitions in one Produce request (the Java client's shape) instead of "
        "one request each (librdkafka's); the figures stay per partition's batch",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--burst-file", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_request and args.phases:
        parser.error("--phases times one request per partition: not with --one-request")
    if args.child:
        print(json.dumps(asyncio_run(measure(args))), flush=True)
        return 0
    checkouts = [Path(c).resolve() for c in args.checkout] or [Path(__file__).resolve().parents[1]]
    shape = (
        f"one request of {args.partitions} partitions' batches a burst (figures per batch)"
        if args.one_request
        else f"{args.partitions} requests a burst"
    )
    print(
        f"# {shape}, each batch {args.records} x {args.record_size} B, "
        f"{args.bursts} bursts a run after {WARMUP_BURSTS}"
    )
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.produce_requests import TOPIC, encoded_burst

    unit = "batch" if args.one_request else "request"  # what the figures are per
    figures: dict[Path, list[float]] = {c: [] for c in checkouts}
    with tempfile.NamedTemporaryFile(prefix="automq-produce-path-") as burst:
        # the requests, made once by this checkout: every run hands the same bytes over
        burst.write(
            encoded_burst(
                args.partitions, args.records, args.record_size, one_request=args.one_request
            )
        )
        burst.flush()
        run_all(args, checkouts, figures, burst.name, TOPIC, unit)
    print(f"# loop CPU per {unit}, median of the runs:")
    for checkout, values in figures.items():
        print(f"{checkout.name:>14}: {statistics.median(values):.1f} us ({checkout})")
    return 0


def run_all(
    args: argparse.Namespace,
    checkouts: list[Path],
    figures: dict[Path, list[float]],
    burst: str,
    topic: str,
    unit: str,
) -> None:
    for run in range(1, args.runs + 1):
        for checkout in checkouts:
            result = run_child(checkout, args, burst, topic)
            figures[checkout].append(result["cpu_us"])
            calls = f"  {result['calls']:.1f} calls/request" if "calls" in result else ""
            if "decode_us" in result:
                calls += (
                    f"  decode {result['decode_us']:.1f} us, handler to the WAL submit "
                    f"{result['to_submit_us']:.1f} us, after it {result['after_submit_us']:.1f} us"
                )
            print(
                f"{checkout.name:>14} run {run}: loop CPU {result['cpu_us']:6.1f} us/{unit}  "
                f"wall {result['wall_us']:6.1f} us/{unit}{calls}",
                flush=True,
            )


def run_child(checkout: Path, args: argparse.Namespace, burst: str, topic: str) -> dict[str, Any]:
    """One run on ``checkout``'s code: this script again, with the checkout first on the path
    (``PYTHONSAFEPATH``: not this script's directory)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child"]
    command += ["--partitions", str(args.partitions), "--bursts", str(args.bursts)]
    command += ["--burst-file", burst, "--topic", topic]
    if args.calls:
        command.append("--calls")
    if args.phases:
        command.append("--phases")
    env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONSAFEPATH="1")
    out = subprocess.run(
        command, cwd=checkout, env=env, capture_output=True, text=True, check=False
    )
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


def split_frames(burst: bytes) -> list[bytes]:
    """The size-prefixed frames of ``burst`` (``produce_requests.encoded_burst``), prefixes
    stripped."""
    frames, pos = [], 0
    while pos < len(burst):
        (size,) = struct.unpack_from(">i", burst, pos)
        frames.append(burst[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return frames


@contextlib.asynccontextmanager
async def in_process_broker(prefix: str) -> AsyncIterator[Any]:
    """A broker with its defaults (file WAL, local object store, SQLite metadata) started in
    this process, in a temporary directory named with ``prefix``, its heap set up as `automq-py
    serve` sets it; stopped and its directory removed after."""
    import logging

    from automq_py.broker import Broker
    from automq_py.config import BrokerConfig
    from storage.heap import keep_large_buffers_in_heap, pretouch_heap

    logging.disable(logging.INFO)
    sys.setswitchinterval(0.0005)  # as `automq-py serve` sets it
    directory = tempfile.mkdtemp(prefix=prefix)
    try:
        config = BrokerConfig.load(
            None,
            [f"log.dirs={directory}", "listeners=PLAINTEXT://127.0.0.1:0"],
            None,
            env={},
            from_env=False,
        )
        keep_large_buffers_in_heap()
        if config.storage.cache_pretouch:
            pretouch_heap(config.storage.wal_cache_size + config.storage.block_cache_size)
        broker = Broker(config)
        await broker.start()
        try:
            assert broker.server is not None and broker.storage is not None
            yield broker
        finally:
            await broker.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def measure(args: argparse.Namespace) -> dict[str, float]:
    from automq_py.apis.deferred import PendingResponse
    from protocol.messages import decode_request

    async with in_process_broker("automq-produce-path-") as broker:
        apis = broker.server.apis
        await apis.ctx.topics.create(args.topic, args.partitions)
        frames = split_frames(Path(args.burst_file).read_bytes())
        wal = broker.storage.wal
        # what the server calls once a connection has read nothing more (a checkout from
        # before the storage's own: the WAL's)
        commit_now = getattr(broker.storage, "commit_now", wal.commit_now)
        submitted = [0.0]  # when the WAL's submit last returned (--phases)

        # a burst's requests handled as one append, as the socket server does with the
        # Produce requests it reads together (a checkout from before that: one by one)
        batched = hasattr(apis, "handle_produce_batch")

        async def one_by_one(phases: list[float] | None) -> list[Any]:
            pending = []
            for frame in frames:
                started = time.perf_counter()
                # writable, as the socket server hands a Produce frame over
                request = decode_request(memoryview(bytearray(frame)), apis.supported)
                decoded = time.perf_counter()
                pending.append(await apis.handle(request))
                if phases is not None:  # decode, to the WAL submit, after it
                    handled = time.perf_counter()
                    phases[0] += decoded - started
                    phases[1] += submitted[0] - decoded
                    phases[2] += handled - submitted[0]
            return pending

        async def burst(phases: list[float] | None = None) -> None:
            if batched and phases is None:  # (--phases times each request)
                requests = [
                    decode_request(memoryview(bytearray(frame)), apis.supported) for frame in frames
                ]
                pending = await apis.handle_produce_batch(requests)
            else:
                pending = await one_by_one(phases)
            commit_now()  # the connection has read nothing more: the burst's commit
            for response in pending:
                # made ahead while the write is in flight, as the server does (a checkout
                # from before that has no prepare)
                prepare = getattr(response, "prepare", None)
                if prepare is not None and not response.future.done():
                    prepare()
            for response in pending:
                if isinstance(response, PendingResponse):
                    if not response.future.done():
                        await response.future
                    response.response()

        for _ in range(WARMUP_BURSTS):
            await burst()
        await asyncio.sleep(1.0)
        gc.collect()
        cpu, wall = time.thread_time(), time.perf_counter()
        for _ in range(args.bursts):
            await burst()
        requests = args.bursts * args.partitions
        result = {
            "cpu_us": (time.thread_time() - cpu) / requests * 1e6,
            "wall_us": (time.perf_counter() - wall) / requests * 1e6,
        }
        if args.calls:
            import cProfile
            import pstats

            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.bursts // 4):
                await burst()
            profile.disable()
            calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
            result["calls"] = calls / (args.bursts // 4 * args.partitions)
        if args.phases:
            submit = wal.submit

            def timed_submit(*a: Any, **k: Any) -> Any:
                future = submit(*a, **k)
                submitted[0] = time.perf_counter()
                return future

            wal.submit = timed_submit  # type: ignore[method-assign]
            phases = [0.0, 0.0, 0.0]
            for _ in range(args.bursts // 4):
                await burst(phases)
            del wal.submit
            per = args.bursts // 4 * args.partitions
            result["decode_us"] = phases[0] / per * 1e6
            result["to_submit_us"] = phases[1] / per * 1e6
            result["after_submit_us"] = phases[2] / per * 1e6
        return result


if __name__ == "__main__":
    sys.exit(main())
