"""kcat 1.7.1 (librdkafka 2.0.2, Debian's build) against the real broker process.

kcat sets headers per invocation (``-H``) and stamps CreateTime itself, so records go in one
kcat run per (codec, partition); each run has its own header values and the timestamps it
stamps must fall inside the run's wall-clock window.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.integration

N = 10_000
PARTITIONS = 3
CODECS = ("gzip", "snappy", "lz4", "zstd")
KCAT_TIMEOUT_S = 60


@dataclass(slots=True, frozen=True)
class Sent:
    key: str
    value: str
    headers: str  # as kcat prints them with %h: name=value,...
    earliest_ms: int
    latest_ms: int


def kcat(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["kcat", *args],
        input=stdin.encode() if stdin is not None else None,
        capture_output=True,
        timeout=KCAT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"kcat {' '.join(args)} failed:\n{done.stderr.decode()}"
    return done.stdout.decode()


def produce_with_kcat(bootstrap: str, topic: str) -> dict[int, list[Sent]]:
    """Record i goes to partition i % 3 in the run for codec i * 4 // N; values contain ':'."""
    expected: dict[int, list[Sent]] = {p: [] for p in range(PARTITIONS)}
    for c, codec in enumerate(CODECS):
        chunk = range(c * N // len(CODECS), (c + 1) * N // len(CODECS))
        for p in range(PARTITIONS):
            indexes = [i for i in chunk if i % PARTITIONS == p]
            lines = [(f"key-{i}", f"value-{i}:{'x' * (i % 50)}") for i in indexes]
            headers = [f"codec={codec}", f"partition={p}", "empty=", "eq=a=b"]
            before = int(time.time() * 1000)
            kcat(
                "-P",
                *("-b", bootstrap, "-t", topic, "-p", str(p), "-K:", "-z", codec),
                *("-X", "acks=all", "-X", "linger.ms=5"),
                *(arg for h in headers for arg in ("-H", h)),
                stdin="".join(f"{k}:{v}\n" for k, v in lines),
            )
            after = int(time.time() * 1000)
            expected[p] += [Sent(k, v, ",".join(headers), before, after) for k, v in lines]
    return expected


def consume_with_kcat(bootstrap: str, topic: str, partition: int) -> list[list[str]]:
    out = kcat(
        "-C",
        *("-b", bootstrap, "-t", topic, "-p", str(partition), "-o", "beginning", "-e"),
        *("-f", "%k|%s|%o|%T|%h\\n"),
    )
    return [line.split("|") for line in out.splitlines()]


def test_kcat_round_trip_all_codecs(broker: BrokerProcess) -> None:
    topic = "kcat-orders"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(15)
    expected = produce_with_kcat(broker.bootstrap, topic)
    assert sum(map(len, expected.values())) == N

    check_with_kcat(broker.bootstrap, topic, expected)
    # the same after a crash (kill -9), then from object storage after a clean restart
    for restart in (broker.kill, broker.stop):
        restart()
        broker.start()
        check_with_kcat(broker.bootstrap, topic, expected)


def check_with_kcat(bootstrap: str, topic: str, expected: dict[int, list[Sent]]) -> None:
    for p, sent in expected.items():
        got = consume_with_kcat(bootstrap, topic, p)
        assert len(got) == len(sent), f"partition {p}: {len(got)} records, sent {len(sent)}"
        last_ts = 0
        for offset, (fields, want) in enumerate(zip(got, sent, strict=True)):
            where = f"partition {p} offset {offset}"
            key, value, got_offset, ts, headers = fields
            assert (key, value, headers) == (want.key, want.value, want.headers), where
            assert int(got_offset) == offset, where
            assert want.earliest_ms <= int(ts) <= want.latest_ms, f"{where}: timestamp {ts}"
            assert int(ts) >= last_ts, f"{where}: timestamp went back"
            last_ts = int(ts)
