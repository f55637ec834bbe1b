"""Broker CPU per Produce request, from a client that costs next to nothing.

A raw socket sends produce traffic in librdkafka's shape: one Produce request per partition,
the partitions' requests together in a burst (their linger timers run out together), each
pre-encoded once (v9, acks=all, one batch of ``--records`` records of ``--record-size`` random
bytes, no key), ``--bursts-per-s`` bursts a second, at most ``MAX_BURSTS_IN_FLIGHT`` of them
unanswered (librdkafka's max.in.flight). The broker is automq-py with its defaults (file WAL
written with zeros at start, local object store, caches pre-touched), fresh in a temporary
directory, in a session of its own. Per run it prints the Produce requests answered a second,
the broker's CPU per request (the whole process, and its event-loop thread alone), the host's
slowdown over the window (``produce_consume.py``'s ``SpeedProbe``: 1.00 is full speed), and the
time from a burst's send to each of its answers (p50/p99).

Each checkout's broker runs with ``PYTHONPATH`` at that checkout and ``PYTHONSAFEPATH`` set:
the broker process starts in this checkout's directory, which ``python -m`` would otherwise put
first on ``sys.path``, running this checkout's code whichever ``--checkout`` was asked for.

``--one-request`` sends each burst as one request of every partition (the Java client's
shape; the CPU figures per batch); ``--tansu`` also runs Tansu 0.6.0 with its memory engine,
alternated with the checkouts (its CPU is the process's, all its threads), for its burst to
answer beside automq-py's.

The clients of ``produce_consume.py`` take 0.3-0.6 cores beside the broker on two cores; this
one leaves the broker's figures to the broker. Use it to compare the request path's cost
between checkouts, alternated in one invocation, on the same machine::

    .venv/bin/python bench/produce_requests.py                      # this checkout, 3 runs
    .venv/bin/python bench/produce_requests.py --checkout /tmp/old --checkout . --runs 4

With the defaults (8 partitions, 15 records of 1 KiB a request, 154 bursts a second) the broker
takes 20 MB/s in ~1,230 requests a second, what librdkafka sends at 20 MB/s with linger.ms=5.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import ProduceRequest
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.produce_consume import AutomqBroker, SpeedProbe, TansuBroker, cpu_seconds
from protocol.records import RecordInput, build_batch

TOPIC = "produce-requests"
PRODUCE_VERSION = 9
MAX_BURSTS_IN_FLIGHT = 5  # librdkafka's max.in.flight.requests.per.connection
WARMUP_S = 3.0  # sent before the measured window: the connection, the partitions' first appends
WAL_SUMMARY = re.compile(r"(\d+) group commits .*?(\d+) appends:")
SETTLE_S = 5.0  # after start: the WAL's zeros written (s3.wal.init.zero) reach the disk


def encoded_burst(
    partitions: int, records: int, record_size: int, *, one_request: bool = False
) -> bytes:
    """One size-prefixed Produce request per partition, back to back (librdkafka's shape), or
    with ``one_request`` a single request carrying every partition's batch (the Java
    client's)."""
    out = bytearray()
    payload = os.urandom(record_size)
    now_ms = int(time.time() * 1000)
    data = ProduceRequest.TopicProduceData
    batches = [
        data.PartitionProduceData(
            index=p,
            records=bytes(build_batch([RecordInput(payload, None, timestamp=now_ms)] * records)),
        )
        for p in range(partitions)
    ]
    groups = [batches] if one_request else [[batch] for batch in batches]
    for correlation_id, group in enumerate(groups):
        request = ProduceRequest[PRODUCE_VERSION](
            transactional_id=None,
            acks=-1,
            timeout_ms=30_000,
            topic_data=[data(name=TOPIC, partition_data=group)],
        )
        request.with_header(correlation_id=correlation_id, client_id="produce-requests")
        body = bytes(request.encode(header=True))
        out += struct.pack(">i", len(body)) + body
    return bytes(out)


def broker_cpu(pid: int, *, event_loop: bool = False) -> float:
    """CPU seconds of the broker process so far, or of its main thread (the event loop)."""
    # (a thread's /proc/<pid>/task/<tid>/stat has the process's fields)
    seconds = cpu_seconds(f"{pid}/task/{pid}" if event_loop else pid)
    if seconds is None:
        raise RuntimeError(f"broker process {pid} is gone")
    return seconds


class Answers:
    """Reads the broker's responses off the socket (a thread of its own) and times each from
    its burst's send."""

    def __init__(self, sock: socket.socket, partitions: int) -> None:
        self.sock = sock
        self.partitions = partitions
        self.sent_at: list[float] = []  # per burst
        self.latencies: list[float] = []  # per response, seconds
        self.count = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, name="answers", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        buf = b""
        while data := self._recv():
            buf += data
            while len(buf) >= 4 and len(buf) >= 4 + (size := struct.unpack_from(">i", buf)[0]):
                buf = buf[4 + size :]
                now = time.perf_counter()
                with self.lock:
                    self.latencies.append(now - self.sent_at[self.count // self.partitions])
                    self.count += 1

    def _recv(self) -> bytes:
        try:
            return self.sock.recv(1 << 16)
        except OSError:  # closed at the run's end
            return b""


def run(
    args: argparse.Namespace, checkout: Path | None, workdir: Path, speed: SpeedProbe
) -> tuple[str, float]:
    """One broker from ``checkout`` (None: Tansu memory), one measured window: the figures'
    line and the broker's CPU per request (us); ``speed`` gives the host's slowdown over the
    window."""
    workdir.mkdir(parents=True)
    broker: AutomqBroker | TansuBroker
    if checkout is None:
        broker = TansuBroker("tansu-mem", workdir, None)
    else:
        os.environ["PYTHONPATH"] = str(checkout)
        os.environ["PYTHONSAFEPATH"] = "1"  # (see the module's docstring)
        # produce_consume.py's automq-file broker: the broker's defaults, a session of its own
        broker = AutomqBroker("automq-file", workdir / "data", None, {})
    automq = isinstance(broker, AutomqBroker)
    broker.start()
    try:
        time.sleep(SETTLE_S)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, args.partitions, 1)]).values():
            future.result(30)
        del admin  # (its connection would log the broker's stop)
        burst = encoded_burst(
            args.partitions, args.records, args.record_size, one_request=args.one_request
        )
        per_burst = 1 if args.one_request else args.partitions  # responses a burst
        pid = broker.pid
        assert pid is not None
        host, port = broker.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            answers = Answers(sock, per_burst)
            t0 = time.perf_counter()
            sent = 0
            measured_from: tuple[float, float, float, int, int] | None = None
            wall_from = 0.0
            with tqdm(
                total=args.seconds,
                desc=f"{'tansu-mem' if checkout is None else checkout.name} produce",
                unit="s",
                leave=False,
                file=sys.stderr,
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s",
            ) as bar:
                while (now := time.perf_counter()) < t0 + WARMUP_S + args.seconds:
                    if measured_from is None and now >= t0 + WARMUP_S:
                        with answers.lock:
                            seen, answered = len(answers.latencies), answers.count
                        wall_from = time.time()
                        measured_from = (
                            now,
                            broker_cpu(pid),
                            broker_cpu(pid, event_loop=automq),
                            seen,
                            answered,
                        )
                    if measured_from is not None:
                        bar.n = min(args.seconds, now - measured_from[0])
                        if sent % 64 == 0:
                            bar.refresh()
                    due = t0 + sent / args.bursts_per_s
                    if due > now:
                        time.sleep(due - now)
                    while sent - answers.count // per_burst >= MAX_BURSTS_IN_FLIGHT:
                        if not answers.thread.is_alive():
                            raise RuntimeError("the broker closed the connection")
                        time.sleep(0.0002)
                    answers.sent_at.append(time.perf_counter())
                    sock.sendall(burst)
                    sent += 1
            assert measured_from is not None
            start, cpu0, loop0, seen0, answered0 = measured_from
            elapsed = time.perf_counter() - start
            slowdown = speed.slowdown(wall_from, time.time())
            cpu, loop_cpu = broker_cpu(pid) - cpu0, broker_cpu(pid, event_loop=automq) - loop0
            with answers.lock:
                answered = answers.count - answered0
                window = sorted(answers.latencies[seen0:])
    finally:
        code = broker.stop()
    if code != 0 and automq:  # (Tansu exits with its signal's code)
        raise RuntimeError(f"the broker exited with {code}:\n{broker.log_tail()}")
    # its WAL's summary at the stop (over its whole life): how many appends a commit took
    wal = WAL_SUMMARY.search(broker.log_path.read_text(errors="replace")) if automq else None
    per_commit = f"  WAL appends/commit {int(wal[2]) / int(wal[1]):.1f}" if wal else ""
    if not answered:
        raise RuntimeError("no Produce request answered in the measured window")
    p50 = window[len(window) // 2] * 1e3
    p99 = window[min(len(window) - 1, int(len(window) * 0.99))] * 1e3
    batches = answered * (args.partitions if args.one_request else 1)
    per_request = cpu * 1e6 / batches
    unit = "batch" if args.one_request else "request"
    line = (
        f"{answered / elapsed:6.0f} req/s  broker CPU {per_request:4.0f} us/{unit} "
        f"({'event loop ' + format(loop_cpu * 1e6 / batches, '4.0f') if automq else 'threads'}"
        f"; host slowdown "
        f"{'-' if slowdown is None else f'{slowdown:.2f}'})  "
        f"burst to answer p50 {p50:5.2f} ms "
        f"p99 {p99:6.2f} ms{per_commit}"
    )
    return line, per_request


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring (and bench/README.md) for what is measured.",
    )
    parser.add_argument("--partitions", type=int, default=8, help="requests per burst (8)")
    parser.add_argument("--records", type=int, default=15, help="records per request (15)")
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record (1024)")
    parser.add_argument("--bursts-per-s", type=float, default=154.0, help="bursts a second (154)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds a run (20)")
    parser.add_argument("--runs", type=int, default=3, help="runs per checkout (3)")
    parser.add_argument(
        "--checkout",
        type=Path,
        action="append",
        help="a checkout of automq-py whose broker to run (repeatable: runs alternate between "
        "them); default: this one",
    )
    parser.add_argument(
        "--one-request",
        action="store_true",
        help="a burst's partitions in one Produce request (the Java client's shape); the CPU "
        "figures per batch",
    )
    parser.add_argument(
        "--tansu",
        action="store_true",
        help="also run Tansu 0.6.0 with its memory engine, alternated with the checkouts",
    )
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkout or [Path(__file__).resolve().parents[1]]]
    for checkout in checkouts:
        if not (checkout / "automq_py" / "__main__.py").is_file():
            parser.error(f"--checkout {checkout}: no automq_py package there")
    targets: list[Path | None] = [*checkouts, *([None] if args.tansu else [])]
    print(
        f"# {args.partitions} requests a burst of {args.records} x {args.record_size} B, "
        f"{args.bursts_per_s:g} bursts/s, {args.seconds:g} s measured after {WARMUP_S:g} s"
    )
    figures: dict[Path | None, list[float]] = {t: [] for t in targets}
    speed = SpeedProbe()
    try:
        with tempfile.TemporaryDirectory(prefix="automq-produce-requests-") as tmp:
            for i in range(args.runs):
                for target in targets:
                    name = "tansu-mem" if target is None else target.name
                    line, per_request = run(args, target, Path(tmp) / f"run{i}-{name}", speed)
                    figures[target].append(per_request)
                    print(f"{name:>12} run {i + 1}: {line}", flush=True)
    finally:
        speed.stop()
    if args.runs > 1:
        print("# broker CPU per request, median of the runs:")
        for target, runs in figures.items():
            name = "tansu-mem" if target is None else target.name
            print(f"{name:>12}: {statistics.median(runs):.0f} us ({target or 'Tansu memory'})")


if __name__ == "__main__":
    main()
