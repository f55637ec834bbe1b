"""A cluster broker leading many partitions stops on SIGTERM: how long it takes to exit, and how
long until every one of its partitions takes writes on the other brokers.

    python bench/cluster_many.py [--partitions 10000] [--s3-dir /dev/shm] [--keep]

The servers are ``bench/cluster_bench.py``'s: a private PostgreSQL for the metadata, a SeaweedFS
``weed mini`` and three ``python -m automq_py serve`` processes with file WALs of ``--wal-mib``.
Broker 0 starts alone and gets every partition (topics of ``--topic-size`` partitions) and one
record in each; brokers 1 and 2 then join with ``auto.leader.rebalance.enable=false``, so broker
0 keeps leading them all. After ``--settle-s``, SIGTERM to broker 0 (a controlled shutdown: its
partitions are led by the others before it closes them and exits) while a producer
(confluent-kafka, ``acks=all``, idempotent) sends one more record to every partition. Printed:
when broker 0 exited, when brokers 1 and 2 had opened the first, half and every partition (from
their logs) and when the producer had an acknowledgement from half and from every partition
(and how many by broker 0's exit), all from the SIGTERM; the cores each process used in each
phase (to the exit, to the last open, to the last acknowledgement; the client is this process,
the producer's librdkafka threads in it); and the lines the brokers logged about the
hand-over. ``docker stop`` waits 10 s before it kills. With ``--join-rebalance``: how long
after brokers 1 and 2 join the controller's rebalance has each broker leading a third.

MB = 10^6 bytes. Progress goes to stderr, figures to stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cluster_bench import S3_BASE_PORT, Cluster, servers

# what the brokers log about a hand-over, shown as logged
LOG_MARKS = (
    "controlled shutdown",
    "closed ",
    "uploaded ",
    "moving ",
    "broker stopped",
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--partitions", type=int, default=10_000, help="partitions broker 0 leads")
    parser.add_argument("--topic-size", type=int, default=1000, help="partitions per topic")
    parser.add_argument("--wal-mib", type=int, default=512, help="s3.wal.capacity per broker")
    parser.add_argument(
        "--wal",
        choices=["file", "object"],
        default="file",
        help="the brokers' WAL: a file each, or objects in the S3 store (s3.wal.path)",
    )
    parser.add_argument("--settle-s", type=float, default=10.0, help="after the others joined")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for acks")
    parser.add_argument(
        "--broker-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker property (repeatable)",
    )
    parser.add_argument("--heartbeat-ms", type=int, default=0, help="0: the broker's default")
    parser.add_argument("--session-ms", type=int, default=0, help="0: the broker's default")
    parser.add_argument("--s3-dir", metavar="DIR", help="where SeaweedFS keeps its data")
    parser.add_argument("--s3-base-port", type=int, default=S3_BASE_PORT, help="SeaweedFS ports")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        help="record each broker with py-spy (on the path) from the SIGTERM on, as "
        "DIR/bN.txt (folded stacks)",
    )
    parser.add_argument(
        "--join-rebalance",
        action="store_true",
        help="instead of the SIGTERM: brokers 1 and 2 join with auto.leader.rebalance.enable "
        "on, and the time until each broker leads a third of the partitions is printed",
    )
    args = parser.parse_args()
    rebalance = "true" if args.join_rebalance else "false"
    args.broker_config = [f"auto.leader.rebalance.enable={rebalance}", *args.broker_config]
    return args


def topics_for(args: argparse.Namespace) -> dict[str, int]:
    """Topic name -> partitions, ``--partitions`` in all."""
    out: dict[str, int] = {}
    left, n = args.partitions, 0
    while left > 0:
        size = min(args.topic_size, left)
        out[f"many-{n:03d}"] = size
        left -= size
        n += 1
    return out


def create_and_fill(cluster: Cluster, topics: dict[str, int], timeout: float) -> float:
    """Create the topics on broker 0, then one record in every partition; seconds it took."""
    started = time.monotonic()
    admin = cluster.admin(0)
    for future in admin.create_topics(
        [NewTopic(name, count, 1) for name, count in topics.items()], operation_timeout=60
    ).values():
        future.result(timeout)
    acked = send_one_each(cluster.bootstrap(0), topics, "fill", timeout)
    total = sum(topics.values())
    if acked[0] != total:
        raise SystemExit(f"fill: {acked[0]} of {total} partitions acknowledged")
    return time.monotonic() - started


def send_one_each(
    bootstrap: str,
    topics: dict[str, int],
    label: str,
    timeout: float,
    times: list[float] | None = None,
) -> list[int]:
    """One record to every partition; [acknowledged, failed]. ``times`` gets each
    acknowledgement's time.monotonic()."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": int(timeout * 1000),
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    counts = [0, 0]
    total = sum(topics.values())
    bar = tqdm(total=total, desc=label, unit="partition", file=sys.stderr, leave=False)

    def done(err: object, _msg: object) -> None:
        counts[0 if err is None else 1] += 1
        if err is None and times is not None:
            times.append(time.monotonic())
        bar.update()

    for name, count in topics.items():
        for p in range(count):
            producer.produce(name, b"x" * 100, partition=p, on_delivery=done)
            producer.poll(0)
    deadline = time.monotonic() + timeout
    while sum(counts) < total and time.monotonic() < deadline:
        producer.poll(0.1)
    producer.flush(1)
    bar.close()
    return counts


def logged(path: Path, since_wall: float) -> list[tuple[float, str]]:
    """What a broker logged from ``since_wall`` (time.time()) on: seconds after it, and the
    line after its timestamp."""
    out: list[tuple[float, str]] = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            clock = time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
            at = time.mktime(clock) + int(line[20:23]) / 1000
        except ValueError:
            continue
        if at >= since_wall:
            out.append((at - since_wall, line[24:]))
    return out


def log_lines(path: Path, since_wall: float) -> list[str]:
    """The hand-over lines a broker logged from ``since_wall`` on."""
    return [
        f"+{at * 1000:.0f} ms {line}"
        for at, line in logged(path, since_wall)
        if any(mark in line for mark in LOG_MARKS)
    ]


def opened_times(path: Path, since_wall: float) -> list[float]:
    """When the broker logged opening a partition, in seconds after ``since_wall``."""
    return [at for at, line in logged(path, since_wall) if "opened partition" in line]


class CpuSampler:
    """Each process's CPU seconds (:meth:`Cluster.cpu`) every ``interval`` seconds from its
    start, in a thread of its own; :meth:`cores` gives the cores used between two moments."""

    def __init__(self, cluster: Cluster, started: float, interval: float = 0.25) -> None:
        self.cluster, self.started, self.interval = cluster, started, interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic() - self.started, self.cluster.cpu()))
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cores(self, since: float, until: float) -> dict[str, float]:
        """Cores each process used from the sample at or before ``since`` to the first at or
        after ``until`` (seconds from the start). A process that exited in between counts up
        to its last sample."""
        earlier = [s for s in self.samples if s[0] <= since] or self.samples[:1]
        first = max(earlier, key=lambda s: s[0])
        later = [s for s in self.samples if s[0] >= until] or self.samples[-1:]
        last = min(later, key=lambda s: s[0])
        span = max(last[0] - first[0], 1e-9)
        out = {}
        for name, start in first[1].items():
            # the last sample the process was alive in (a gone process reads 0)
            end = max(
                (c[name] for t, c in self.samples if first[0] <= t <= last[0] and c[name] > 0),
                default=start,
            )
            out[name] = max(end - start, 0.0) / span
        return out


def profile(cluster: Cluster, out: str) -> list[subprocess.Popen[bytes]]:
    """py-spy recording every running broker until stopped."""
    os.makedirs(out, exist_ok=True)
    beside = Path(sys.executable).parent / "py-spy"  # installed in the bench's venv
    spy = str(beside) if beside.exists() else "py-spy"
    return [
        subprocess.Popen(
            [
                spy,
                "record",
                "-p",
                str(b.pid),
                "-r",
                "100",
                "-f",
                "raw",
                "-o",
                os.path.join(out, f"b{n}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n, b in enumerate(cluster.brokers)
        if b.pid is not None
    ]


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    root = Path(tempfile.mkdtemp(prefix="automq-cluster-many-"))
    topics = topics_for(args)
    total = sum(topics.values())
    try:
        with servers(root, args) as (s3, database):
            print(
                f"# cluster many-partitions bench, {time.strftime('%Y-%m-%d %H:%M')}, "
                f"{os.cpu_count()} cores, 3 brokers, PostgreSQL metadata, SeaweedFS; broker 0 "
                f"leads {total} partitions in {len(topics)} topics",
                flush=True,
            )
            cluster = Cluster(root, s3, database, args)
            try:
                run(cluster, args, topics)
            finally:
                if any(b.running for b in cluster.brokers):
                    cluster.stop(30)
    finally:
        if args.keep:
            print(f"# work directory kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def even_leaders(cluster: Cluster, topics: dict[str, int], timeout: float) -> float:
    """When (time.monotonic()) Metadata first shows each broker leading a third of the
    partitions (to one), polled every 0.1 s."""
    admin = cluster.admin(1)
    total = sum(topics.values())
    deadline = time.monotonic() + timeout
    while True:
        listed = admin.list_topics(timeout=30).topics
        led = [0, 0, 0]
        for name in topics:
            for p in listed[name].partitions.values():
                if 0 <= p.leader < 3:
                    led[p.leader] += 1
        now = time.monotonic()
        if min(led) >= total // 3 - 1:
            return now
        if now > deadline:
            raise SystemExit(f"leadership not even {timeout:.0f} s after the join: {led}")
        time.sleep(0.1)


def run(cluster: Cluster, args: argparse.Namespace, topics: dict[str, int]) -> None:
    total = sum(topics.values())
    print("# starting broker 0", file=sys.stderr)
    cluster.brokers[0].start(timeout=120)
    cluster.wait_for_brokers({0})
    filled = create_and_fill(cluster, topics, args.timeout)
    print(f"# {total} partitions created on broker 0 with a record each in {filled:.1f} s")
    print("# starting brokers 1 and 2", file=sys.stderr)
    started = time.monotonic()
    starters = [threading.Thread(target=b.start, args=(120,)) for b in cluster.brokers[1:]]
    for t in starters:
        t.start()
    for t in starters:
        t.join()
    cluster.wait_for_brokers({0, 1, 2})
    if args.join_rebalance:
        joined = time.monotonic() - started
        spread = even_leaders(cluster, topics, args.timeout)
        print(
            f"# brokers 1 and 2 joined {joined:.2f} s after their start; each broker leads "
            f"a third of the partitions {spread - started:.2f} s after it"
        )
        return
    time.sleep(args.settle_s)
    leaders = cluster.admin(1).list_topics(timeout=30).topics
    led = sum(1 for name in topics for p in leaders[name].partitions.values() if p.leader == 0)
    print(f"# broker 0 leads {led} of {total} partitions before the SIGTERM")

    victim = cluster.brokers[0]
    exited: list[tuple[int, float]] = []
    acks: list[float] = []
    counts: list[int] = []
    at, at_wall = time.monotonic(), time.time()

    def stop() -> None:
        code = victim.stop(120)
        exited.append((code, time.monotonic()))

    def produce() -> None:
        counts.extend(
            send_one_each(cluster.bootstrap(1, 2), topics, "after SIGTERM", args.timeout, acks)
        )

    print("# SIGTERM to broker 0", file=sys.stderr)
    sampler = CpuSampler(cluster, at)
    spies = profile(cluster, args.py_spy) if args.py_spy else []
    producer = threading.Thread(target=produce)
    stopper = threading.Thread(target=stop)
    stopper.start()
    producer.start()
    stopper.join(150)
    producer.join(args.timeout + 30)
    sampler.stop()
    for spy in spies:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it recorded
        spy.wait(30)
    if not exited:
        print("# broker 0 had not exited 150 s after the SIGTERM")
        return
    code, exit_at = exited[0]
    exit_s = exit_at - at
    print(f"# broker 0 exited with {code} {exit_s:.2f} s after the SIGTERM")
    opened = sorted(
        t for broker in cluster.brokers[1:] for t in opened_times(broker.log_path, at_wall)
    )
    if opened:
        print(
            f"# opened on brokers 1 and 2: {len(opened)} partitions, the first "
            f"{opened[0]:.2f} s, the median {opened[len(opened) // 2]:.2f} s and the last "
            f"{opened[-1]:.2f} s after the SIGTERM "
            f"({sum(1 for t in opened if t <= exit_s)} by broker 0's exit)"
        )
    if counts:
        at_exit = sum(1 for t in acks if t <= exit_at)
        acked = sorted(t - at for t in acks) or [float("nan")]
        print(
            f"# every partition on brokers 1 and 2: {counts[0]} of {total} acknowledged a "
            f"record, the median {acked[len(acked) // 2]:.2f} s and the last {acked[-1]:.2f} s "
            f"after the SIGTERM ({at_exit} by broker 0's exit); {counts[1]} failed"
        )
    phases = [("exit", exit_s)]
    if opened:
        phases.append(("last open", opened[-1]))
    if acks:
        phases.append(("last ack", max(acks) - at))
    since = 0.0
    for name, until in phases:
        if until > since:
            used = sampler.cores(since, until)
            print(
                f"# cores used, {since:.2f}-{until:.2f} s (to the {name}): "
                + ", ".join(f"{process} {cores:.2f}" for process, cores in used.items())
            )
            since = until
    for node, broker in enumerate(cluster.brokers):
        for line in log_lines(broker.log_path, at_wall):
            print(f"#   b{node} {line}")


if __name__ == "__main__":
    main()
