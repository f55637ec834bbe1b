"""Compacted topic benchmark: many updates over few keys, then key compaction.

Starts automq-py (embedded ``file://`` store, in a temporary directory, loopback), creates a
topic with ``cleanup.policy=compact``, produces ``--updates`` records over ``--keys`` keys with
confluent-kafka, runs ``automq-py compact --kind key`` against it (Spark ``local[2]``, or
``--runner local``), then reads every partition from offset 0 and prints, per partition: the
records before and after, the live records below the active segment (what the cleaning must
bound to one per key) and in the active segment, and whether every key reads back its last
value at its original offset; with the job's wall time and summary line.

    python bench/compacted_topic.py [--updates 1000000] [--keys 1000] [--partitions 4]

Stops the broker and removes its directory at the end (``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tqdm import tqdm

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spark_jobs.controller_client import ControllerClient  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

TOPIC = "compacted"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--updates", type=int, default=1_000_000, help="records produced (1000000)")
    p.add_argument("--keys", type=int, default=1000, help="distinct keys (1000)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the topic (4)")
    p.add_argument("--value-size", type=int, default=100, help="bytes per value (100)")
    p.add_argument(
        "--segment-bytes", type=int, default=4 << 20, help="the topic's segment.bytes (4 MiB)"
    )
    p.add_argument(
        "--runner", choices=("spark", "local"), default="spark", help="where the job's units run"
    )
    p.add_argument("--keep", action="store_true", help="keep the broker's directory")
    return p.parse_args()


def produce(bootstrap: str, args: argparse.Namespace) -> dict[tuple[int, bytes], int]:
    """Every key's last offset, per (partition, key)."""
    last: dict[tuple[int, bytes], int] = {}

    def delivered(err: object, msg: object) -> None:
        if err is None:
            last[(msg.partition(), msg.key())] = msg.offset()  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    pad = b"x" * max(0, args.value_size - 16)
    for i in tqdm(range(args.updates), desc="produce", unit="rec", file=sys.stderr):
        key = b"k%d" % (i % args.keys)
        while True:
            try:
                producer.produce(TOPIC, b"%d:" % i + pad, key=key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(120)
    return last


def read_back(bootstrap: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, key) of every record, per partition, from offset 0."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
        for p in range(partitions)
    }
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    done: set[int] = {p for p, end in ends.items() if end == 0}
    deadline = time.monotonic() + 600
    while len(done) < partitions and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, 1.0):
            partition, offset, key = msg.partition(), msg.offset(), msg.key()
            if msg.error() is None and partition is not None and offset is not None:
                got[partition].append((offset, key or b""))
                if offset >= ends[partition] - 1:
                    done.add(partition)
    consumer.close()
    return got


def active_bases(bootstrap: str) -> dict[int, int]:
    async def go() -> dict[int, int]:
        async with await ControllerClient.connect(bootstrap) as client:
            logs, _ = await client.describe_log_segments([TOPIC])
        return {log.partition: log.segments[-1].base_offset for log in logs}

    return asyncio.run(go())


def main() -> None:
    args = parse_args()
    root = Path(tempfile.mkdtemp(prefix="automq-compacted-bench-"))
    broker = BrokerProcess(root / "broker", {"s3.maintenance.runner": "none"})
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {
            "cleanup.policy": "compact",
            "segment.bytes": str(args.segment_bytes),
            "min.cleanable.dirty.ratio": "0.01",
        }
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1, config=config)])[TOPIC].result(30)
        started = time.monotonic()
        last = produce(broker.bootstrap, args)
        produced_s = time.monotonic() - started
        before = {p: len(v) for p, v in read_back(broker.bootstrap, args.partitions).items()}
        command = [
            sys.executable, "-m", "automq_py", "compact", "--kind", "key",
            "--bootstrap-server", broker.bootstrap, "--runner", args.runner,
        ]  # fmt: skip
        if args.runner == "spark":
            command += ["--master", "local[2]"]
        for key, value in broker.overrides.items():
            command += ["--override", f"{key}={value}"]
        started = time.monotonic()
        job = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=3600)
        job_s = time.monotonic() - started
        if job.returncode != 0:
            raise SystemExit(f"the job failed:\n{job.stdout}\n{job.stderr}")
        after = read_back(broker.bootstrap, args.partitions)
        bases = active_bases(broker.bootstrap)
        print(
            f"# compacted topic, {time.strftime('%Y-%m-%d %H:%M')}: {args.updates} updates over "
            f"{args.keys} keys, {args.partitions} partitions, {args.value_size} B values, "
            f"segment.bytes {args.segment_bytes}; produced in {produced_s:.1f} s"
        )
        print(f"# key compaction ({args.runner}): {job_s:.1f} s; {job.stdout.splitlines()[-1]}")
        print("partition  before   after  below-active (distinct keys)  in-active  last values")
        for p in range(args.partitions):
            records = after[p]
            below = [k for o, k in records if o < bases[p]]
            survivors = {k: o for o, k in records}
            expected = {k: o for (part, k), o in last.items() if part == p}
            ok = all(survivors.get(k) == o for k, o in expected.items())
            verdict = "all at their offsets" if ok else "WRONG"
            print(
                f"{p:9d}  {before[p]:6d}  {len(records):6d}  {len(below):6d} "
                f"({len(set(below)):5d}){'':17s}{len(records) - len(below):9d}  {verdict}"
            )
    finally:
        code = broker.stop()
        if code != 0:
            print(f"broker exited with {code}:\n{broker.log_tail()}", file=sys.stderr)
        if args.keep:
            print(f"# kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
