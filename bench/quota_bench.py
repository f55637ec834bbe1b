"""Client quotas under load: two producers on one broker, one of them limited to 1 MB/s.

    python bench/quota_bench.py [--seconds 30] [--warmup-s 30] [--quota-mbps 1] \
        [--brokers automq kafka] [--s3-dir /dev/shm]

Each broker (a fresh automq-py with its embedded file store, and Apache Kafka 4.4 from
``make java``'s jars, as ``bench/produce_consume.py`` runs it) gets ``producer_byte_rate``
for client id ``noisy`` through AlterClientQuotas, as ``kafka-configs --alter --add-config
producer_byte_rate=... --entity-type clients --entity-name noisy`` sets it. Then:

1. ``calm`` alone for ``--seconds``: a confluent-kafka producer, one ``produce()`` with a
   delivery callback per 1 KiB record, offered ``--calm-mbps``;
2. ``calm`` again beside ``noisy``, a second producer producing as fast as it can (a
   ``produce()`` per record, up to 16 MiB outstanding), for ``--warmup-s`` then ``--seconds``.

Printed: each producer's acknowledged MB/s per second and over the measured ``--seconds`` (after
the warm-up: the quota's window lets a new client's first burst through, as Kafka's does),
noisy's against its quota (the goal: within 10%), calm's throughput and latency alone and beside
noisy (the goal: unaffected), and the throttle times the broker told noisy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, AlterClientQuotasResponse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.apache_kafka import KafkaServer
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection

MB = 1_000_000
RECORD = 1024
PARTITIONS = 4


@dataclass
class Run:
    name: str
    acked: list[float] = field(default_factory=list)  # when each record was acknowledged
    latencies_ms: list[float] = field(default_factory=list)
    throttles_ms: list[float] = field(default_factory=list)
    errors: int = 0


def set_quota(bootstrap: str, client_id: str, bytes_per_s: float) -> None:
    conn = RawConnection(bootstrap)
    try:
        request = AlterClientQuotasRequest[1](
            entries=[
                AlterClientQuotasRequest.EntryData(
                    entity=[
                        AlterClientQuotasRequest.EntryData.EntityData(
                            entity_type="client-id", entity_name=client_id
                        )
                    ],
                    ops=[
                        AlterClientQuotasRequest.EntryData.OpData(
                            key="producer_byte_rate", value=float(bytes_per_s), remove=False
                        )
                    ],
                )
            ],
            validate_only=False,
        )
        response = conn.call(request, AlterClientQuotasResponse)
    finally:
        conn.close()
    (entry,) = response.entries
    if entry.error_code != 0:
        raise SystemExit(f"AlterClientQuotas failed: {entry.error_code} {entry.error_message}")


def produce(
    bootstrap: str,
    topic: str,
    run: Run,
    seconds: float,
    rate_mbps: float | None,
    stop: threading.Event,
) -> None:
    """Produce for ``seconds`` (offered ``rate_mbps``, or as fast as 16 MiB outstanding allow)."""

    def stats(raw: str) -> None:
        for broker in json.loads(raw).get("brokers", {}).values():
            throttle = broker.get("throttle", {})
            if throttle.get("cnt", 0):
                run.throttles_ms.append(throttle["max"])

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": run.name,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.kbytes": 16 * 1024,
            "statistics.interval.ms": 1000,
            "stats_cb": stats,
        }
    )
    payload = os.urandom(RECORD)
    start = time.monotonic()
    interval = RECORD / (rate_mbps * MB) if rate_mbps else 0.0
    sent = 0

    def delivered(sent_at: float):  # type: ignore[no-untyped-def]
        def callback(err, _msg):  # type: ignore[no-untyped-def]
            now = time.monotonic()
            if err is not None:
                run.errors += 1
                return
            run.acked.append(now)
            run.latencies_ms.append((now - sent_at) * 1000)

        return callback

    while not stop.is_set():
        now = time.monotonic()
        if now - start >= seconds:
            break
        if interval:
            due = start + sent * interval
            if due > now + 0.002:
                producer.poll(min(due - now, 0.05))
                continue
        try:
            producer.produce(
                topic, payload, partition=sent % PARTITIONS, on_delivery=delivered(now)
            )
            sent += 1
        except BufferError:
            producer.poll(0.01)
            continue
        producer.poll(0)
    producer.flush(30)


def per_second(run: Run, start: float, seconds: float) -> list[float]:
    buckets = [0] * int(seconds)
    for t in run.acked:
        i = math.floor(t - start)
        if 0 <= i < len(buckets):
            buckets[i] += 1
    return [n * RECORD / MB for n in buckets]


def phase(
    bootstrap: str, topic: str, runs: list[tuple[Run, float | None]], seconds: float, warmup: float
) -> float:
    """Run the producers for ``warmup`` + ``seconds``; when the measured part started."""
    stop = threading.Event()
    start = time.monotonic()
    threads = [
        threading.Thread(target=produce, args=(bootstrap, topic, run, warmup + seconds, rate, stop))
        for run, rate in runs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return start + warmup


def report(label: str, run: Run, start: float, seconds: float) -> tuple[float, float]:
    series = per_second(run, start, seconds)
    # the first seconds are the client's ramp and the quota's first throttle: the whole
    # phase counts, as a user sees it
    mbps = len([t for t in run.acked if start <= t < start + seconds]) * RECORD / MB / seconds
    p99 = statistics.quantiles(run.latencies_ms, n=100)[98] if len(run.latencies_ms) > 1 else 0.0
    print(
        f"{label:<28} {mbps:7.3f} MB/s over {seconds:g} s, p50 "
        f"{statistics.median(run.latencies_ms) if run.latencies_ms else 0:7.1f} ms, "
        f"p99 {p99:8.1f} ms, errors {run.errors}"
    )
    print(f"  per second: {' '.join(f'{x:.2f}' for x in series)}")
    if run.throttles_ms:
        print(
            f"  throttle_time_ms the broker told it: {len(run.throttles_ms)} windows, "
            f"max {max(run.throttles_ms):.0f} ms"
        )
    return mbps, p99


def run_broker(name: str, bootstrap: str, args: argparse.Namespace) -> None:
    topic = "quota-bench"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result(30)
    time.sleep(2)  # (Kafka's broker applies the new topic's metadata meanwhile)
    set_quota(bootstrap, "noisy", args.quota_mbps * MB)
    calm_alone = Run("calm")
    start = phase(bootstrap, topic, [(calm_alone, args.calm_mbps)], args.seconds, 0)
    alone = report(f"{name}: calm alone", calm_alone, start, args.seconds)
    calm, noisy = Run("calm"), Run("noisy")
    start = phase(
        bootstrap, topic, [(calm, args.calm_mbps), (noisy, None)], args.seconds, args.warmup_s
    )
    beside = report(f"{name}: calm beside noisy", calm, start, args.seconds)
    held, _ = report(f"{name}: noisy (quota'd)", noisy, start, args.seconds)
    whole = len(noisy.acked) * RECORD / MB / (args.warmup_s + args.seconds)
    print(
        f"{name}: noisy held at {held:.3f} MB/s over the {args.seconds:g} s after "
        f"{args.warmup_s:g} s: {held / args.quota_mbps - 1:+.1%} of its quota "
        f"({whole:.3f} MB/s counting its first burst); calm {beside[0] / alone[0] - 1:+.1%} MB/s, "
        f"p99 {beside[1]:.1f} ms ({alone[1]:.1f} ms alone)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured time")
    parser.add_argument("--warmup-s", type=float, default=30.0, help="noisy's time before it")
    parser.add_argument("--quota-mbps", type=float, default=1.0, help="noisy's producer_byte_rate")
    parser.add_argument("--calm-mbps", type=float, default=10.0, help="calm's offered MB/s")
    parser.add_argument(
        "--brokers", nargs="+", choices=("automq", "kafka"), default=["automq", "kafka"]
    )
    parser.add_argument("--s3-dir", default=None, help="where the brokers' data goes")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="automq-quota-bench-", dir=args.s3_dir))
    print(
        f"# quota bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores: noisy "
        f"limited to {args.quota_mbps:g} MB/s (producer_byte_rate), calm offered "
        f"{args.calm_mbps:g} MB/s, 1 KiB records, acks=all; {args.seconds:g} s measured"
    )
    try:
        for name in args.brokers:
            broker: BrokerProcess | KafkaServer
            if name == "automq":
                broker = BrokerProcess(root / "automq", {"s3.wal.capacity": str(1 << 30)})
            else:
                broker = KafkaServer(root / "kafka")
            try:
                broker.start()
                run_broker(name, broker.bootstrap, args)
            finally:
                code = broker.stop()
                if code != 0:
                    print(f"{name} exited with {code}", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
