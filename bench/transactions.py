"""Transactional produce benchmark: automq-py against Tansu 0.6.0, same confluent-kafka workload.

One run starts every broker on loopback in turn (as ``bench/produce_consume.py``, whose broker
classes and helpers it uses), runs the same transactional workload against each and prints the
figures side by side with the automq-py/Tansu ratios.

    python bench/transactions.py [--mib 64] [--records-per-txn 100] [--partitions 8] [--brokers ...]

Brokers (``--brokers``, default all):
* ``automq-file`` automq-py with its embedded ``file://`` object store;
* ``automq-s3``   automq-py storing in a SeaweedFS ``weed mini`` the bench starts;
* ``tansu-mem``   Tansu 0.6.0 ``--storage-engine memory://tansu/``;
* ``tansu-s3``    Tansu 0.6.0 ``--storage-engine s3://tansu/`` on the same SeaweedFS.

Workload: a confluent-kafka Producer with ``transactional.id`` (so idempotence and acks=all),
``linger.ms=5``, no compression; ``init_transactions()``, then ``--mib`` MiB of 1 KiB records
(no key) spread round-robin over the ``--partitions`` partitions of a fresh topic, one
transaction committed every ``--records-per-txn`` records (begin_transaction(), produce() the
records, commit_transaction()). Each record's value starts with its index (8 bytes, big-endian)
so the read-back can tell which records came back. Figures:
* records/s, MB/s and transactions/s: committed records (bytes, transactions) / time from the
  first begin_transaction() to the last commit_transaction()'s return;
* commit latency p50/p99: commit_transaction() call to return. It includes delivering what the
  producer still holds (librdkafka flushes first: the records of the last ``linger.ms``, and
  before them the AddPartitionsToTxn that registers the transaction's partitions) and the EndTxn
  round trip (a Kafka coordinator answers once PrepareCommit is durable and writes the markers
  after);
* init_transactions() time (after the warm-up, so the coordinator is already there). librdkafka
  makes it about 55 or about 505 ms (its 500 ms PID timer when the connection is not up yet),
  whatever the broker;
* read-back: a Consumer with ``isolation.level=read_committed`` assign()ed to every partition
  from offset 0 (no group join) reads until it has as many records as were committed, then goes
  on for ``--grace`` seconds to catch extra ones. The check: every committed record exactly once
  (on the partition it was sent to), nothing else. MB/s: record bytes / time from assign() to
  the last expected record.

A step that fails (an exception, an error in a delivery report, a call past ``--call-timeout``,
the whole produce or read past ``--timeout``) ends that broker's case: the table shows what
happened (e.g. ``init_transactions: KafkaError{...}``) and the run goes on with the next broker.
After each automq-py broker stops, the bench prints the event-loop lag, the request times
(arrival to response) of the transaction APIs and the WAL's group-commit times it logged, and
any WARNING/ERROR lines of its log. ``AddPartitions/txn`` in the table (librdkafka's request
counts) above 1 means AddPartitionsToTxn calls answered CONCURRENT_TRANSACTIONS: the previous
transaction was still completing (its markers and Complete* record being written after EndTxn
was answered, as Kafka does), and librdkafka retries after 20 ms.

``--abort-every K`` aborts every K-th transaction instead (after delivering its records, so the
broker holds them): the read-back must then skip them.

MB = 10^6 bytes. Progress bars go to stderr, figures to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.produce_consume import (  # noqa: E402
    LABELS,
    TANSU_BUCKET,
    AutomqBroker,
    Broker,
    TansuBroker,
    broker_config,
    cpu_snapshot,
    create_bucket,
    create_topic,
    logged_loop_lag,
    pct,
    seaweedfs,
    tansu_binary,
)

KiB = 1024
MiB = 1024 * KiB
INDEX_BYTES = 8
STATS_INTERVAL_MS = 500
PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)
BROKERS = ("automq-file", "automq-s3", "tansu-mem", "tansu-s3")
# automq-py request time lines (logged at stop) worth printing for this workload
TXN_APIS = ("PRODUCE", "ADD_PARTITIONS_TO_TXN", "END_TXN", "INIT_PRODUCER_ID", "FETCH")


@dataclass
class TxResult:
    broker: str
    partitions: int
    records: int  # records the case produces (committed, or aborted with --abort-every)
    records_per_txn: int
    failure: str | None = None  # the first step that failed, and how
    init_ms: float | None = None
    committed_txns: int = 0
    committed_records: int = 0
    aborted_txns: int = 0
    delivered: int = 0  # successful delivery reports
    # requests the producer sent, by name (librdkafka's statistics, summed over its brokers)
    requests: dict[str, int] = field(default_factory=dict)
    produce_s: float | None = None
    commit_ms: list[float] = field(default_factory=list)
    produce_cores: dict[str, float] = field(default_factory=dict)
    read: int | None = None  # records the read_committed consumer got (None: not run)
    read_bytes: int = 0
    read_s: float | None = None
    missing: int = 0  # committed records not read
    duplicates: int = 0  # committed records read more than once
    unexpected: int = 0  # records read that were not committed (aborted, or not ours)
    misplaced: int = 0  # records read from another partition than they were sent to
    notes: list[str] = field(default_factory=list)

    def fail(self, step: str, error: object) -> None:
        if self.failure is None:
            self.failure = f"{step}: {error}"
        else:
            self.notes.append(f"{step}: {error}")

    @property
    def records_s(self) -> float | None:
        return self.committed_records / self.produce_s if self.produce_s else None

    def mbs(self, record_size: int) -> float | None:
        rate = self.records_s
        return rate * record_size / 1e6 if rate is not None else None

    @property
    def txns_s(self) -> float | None:
        return self.committed_txns / self.produce_s if self.produce_s else None

    def per_txn(self, request: str) -> float | None:
        """Requests of a kind the producer sent per transaction (committed or aborted)."""
        txns = self.committed_txns + self.aborted_txns
        return self.requests[request] / txns if txns and request in self.requests else None

    def commit_pct(self, p: int) -> float | None:
        return pct(self.commit_ms, p) if self.commit_ms else None

    @property
    def read_mbs(self) -> float | None:
        return self.read_bytes / self.read_s / 1e6 if self.read_s and self.read_bytes else None

    @property
    def read_ok(self) -> bool:
        return self.read == self.committed_records and not (
            self.missing or self.duplicates or self.unexpected or self.misplaced
        )

    def read_verdict(self) -> str:
        if self.read is None:
            return "not run"
        if self.read_ok:
            return "exact"
        parts = [
            f"{n} {what}"
            for n, what in (
                (self.missing, "missing"),
                (self.duplicates, "dup"),
                (self.unexpected, "extra"),
                (self.misplaced, "misplaced"),
            )
            if n
        ]
        return ", ".join(parts) or f"{self.read}/{self.committed_records}"


# -- workload -----------------------------------------------------------------------------------


def kafka_error(e: BaseException) -> str:
    """A KafkaException's KafkaError as text (code and reason), anything else as its repr."""
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        err: KafkaError = e.args[0]
        return f"{err.name()} {err.str()}"
    return repr(e)


def produce_txns(
    bootstrap: str,
    topic: str,
    txn_id: str,
    args: argparse.Namespace,
    result: TxResult,
    committed: bytearray,
    desc: str,
) -> None:
    """init_transactions(), then transactions of ``--records-per-txn`` records until
    ``result.records`` are committed or a step fails; ``committed[i]`` is set for every record
    of a committed transaction."""
    n = result.records
    per_txn = result.records_per_txn
    tail = os.urandom(args.record_size - INDEX_BYTES)
    errors: list[str] = []
    delivered = 0

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        elif err.code() in PURGED:  # abort_transaction() drops what it has not sent
            pass
        elif len(errors) < 5:
            errors.append(str(err))

    fatal: list[str] = []

    def on_error(err: KafkaError) -> None:
        if err.fatal() and len(fatal) < 5:
            fatal.append(str(err))

    stats_seen = 0

    def on_stats(raw: str) -> None:
        nonlocal stats_seen
        counts: dict[str, int] = {}
        for broker in json.loads(raw).get("brokers", {}).values():
            for name, count in broker.get("req", {}).items():
                counts[name] = counts.get(name, 0) + int(count)
        result.requests = counts
        stats_seen += 1

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "linger.ms": args.linger_ms,
            "compression.type": "none",
            "transaction.timeout.ms": int(args.txn_timeout * 1000),
            "error_cb": on_error,
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "stats_cb": on_stats,
        }
    )
    bar = tqdm(total=n, desc=desc, unit="rec", leave=False, file=sys.stderr)
    deadline = time.monotonic() + args.timeout

    def call_timeout() -> float:
        return max(0.1, min(args.call_timeout, deadline - time.monotonic()))

    step = "init_transactions"
    try:
        t = time.perf_counter()
        producer.init_transactions(call_timeout())
        result.init_ms = (time.perf_counter() - t) * 1e3
        t0 = time.perf_counter()
        i = 0
        while i < n:
            if time.monotonic() > deadline:
                result.fail("produce", f"TIMEOUT after {args.timeout:g} s")
                break
            step = "begin_transaction"
            producer.begin_transaction()
            first, last = i, min(n, i + per_txn)
            step = "produce"
            for index in range(first, last):
                value = index.to_bytes(INDEX_BYTES, "big") + tail
                while True:
                    try:
                        producer.produce(
                            topic,
                            value,
                            partition=index % result.partitions,
                            on_delivery=on_delivery,
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
            if (
                args.abort_every
                and (result.committed_txns + result.aborted_txns + 1) % (args.abort_every) == 0
            ):
                # deliver the records first, so the broker holds them (abort_transaction()
                # would drop what the producer has not sent yet) and read_committed must skip
                # them; this also keeps the abort out of librdkafka's race with a previous
                # commit still completing (confluentinc/librdkafka#4849)
                step = "flush before abort"
                if producer.flush(call_timeout()) > 0:
                    result.fail(step, f"records still unsent after {call_timeout():.0f} s")
                    break
                step = "abort_transaction"
                producer.abort_transaction(call_timeout())
                result.aborted_txns += 1
                bar.update(last - first)
                i = last
                continue
            step = "commit_transaction"
            t = time.perf_counter()
            try:
                producer.commit_transaction(call_timeout())
            except KafkaException as e:
                err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                result.fail(f"commit_transaction (txn {result.committed_txns + 1})", kafka_error(e))
                if err is not None and err.txn_requires_abort():
                    step = "abort_transaction"
                    producer.abort_transaction(call_timeout())
                    result.aborted_txns += 1
                break
            result.commit_ms.append((time.perf_counter() - t) * 1e3)
            committed[first:last] = b"\x01" * (last - first)
            result.committed_txns += 1
            result.committed_records += last - first
            bar.update(last - first)
            i = last
            if errors:  # a commit cannot succeed with a failed record; be sure
                result.fail("delivery", errors[0])
                break
        result.produce_s = time.perf_counter() - t0
        # one more statistics report, for request counts that include the last transaction
        seen, until = stats_seen, time.monotonic() + 3 * STATS_INTERVAL_MS / 1000
        while stats_seen == seen and time.monotonic() < until:
            producer.poll(0.05)
    except KafkaException as e:
        result.fail(step, kafka_error(e))
    finally:
        bar.close()
        result.delivered = delivered
        if fatal:
            result.notes.append(f"fatal producer error: {fatal[0]}")
        producer.purge()
        try:
            producer.close()
        except (KafkaException, RuntimeError) as e:
            result.notes.append(f"producer close: {kafka_error(e)}")


def read_committed(
    bootstrap: str,
    topic: str,
    args: argparse.Namespace,
    result: TxResult,
    committed: bytearray,
    desc: str,
) -> None:
    """Read the topic from offset 0 with read_committed and check it against ``committed``."""
    expected = result.committed_records
    seen = bytearray(len(committed))
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            # confluent-kafka insists on a group.id; assign() never joins the group.
            "group.id": f"bench-unused-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    got = nbytes = 0
    errors: list[str] = []
    bar = tqdm(total=expected, desc=desc, unit="rec", leave=False, file=sys.stderr)

    def take(batch: list[Message]) -> int:
        nonlocal got, nbytes
        n = 0
        for msg in batch:
            if msg.error() is not None:
                if len(errors) < 5:
                    errors.append(str(msg.error()))
                continue
            value = msg.value() or b""
            n += 1
            nbytes += len(value)
            index = int.from_bytes(value[:INDEX_BYTES], "big")
            if len(value) != args.record_size or index >= len(committed):
                result.unexpected += 1
                continue
            if msg.partition() != index % result.partitions:
                result.misplaced += 1
            if not committed[index]:
                result.unexpected += 1
            elif seen[index]:
                result.duplicates += 1
            seen[index] = 1
        got += n
        return n

    try:
        t0 = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(result.partitions)])
        deadline = time.monotonic() + args.timeout
        while got < expected and time.monotonic() < deadline:
            bar.update(take(consumer.consume(min(1000, expected - got), 0.2)))
        result.read_s = time.perf_counter() - t0
        until = time.monotonic() + args.grace  # anything beyond the committed records?
        while time.monotonic() < until:
            take(consumer.consume(1000, 0.1))
    finally:
        bar.close()
        consumer.close()
    result.read = got
    result.read_bytes = nbytes
    result.missing = sum(1 for c, s in zip(committed, seen, strict=True) if c and not s)
    if errors:
        result.notes.append(f"read errors: {len(errors)}+ e.g. {errors[0]}")
    if got < expected:
        result.fail("read_committed", f"TIMEOUT after {args.timeout:g} s ({got}/{expected})")
        result.read_s = None
    elif not result.read_ok:
        result.fail("read check", result.read_verdict())


def run_case(broker: Broker, args: argparse.Namespace, result: TxResult) -> None:
    topic = f"bench-txn-{time.monotonic_ns()}"
    create_topic(broker.bootstrap, topic, result.partitions)
    committed = bytearray(result.records)
    cpu_before = cpu_snapshot(broker)
    started = time.perf_counter()
    produce_txns(
        broker.bootstrap,
        topic,
        f"bench-txn-{time.monotonic_ns()}",
        args,
        result,
        committed,
        f"{broker.name} txn produce",
    )
    elapsed = time.perf_counter() - started
    cpu_after = cpu_snapshot(broker)
    if elapsed > 0:
        result.produce_cores = {
            k: (cpu_after[k] - cpu_before.get(k, 0.0)) / elapsed for k in cpu_after
        }
    if result.committed_records or result.delivered:
        read_committed(broker.bootstrap, topic, args, result, committed, f"{broker.name} read")


def report_automq_log(broker: Broker, since: int) -> None:
    """What an automq-py broker logged: loop lag, transaction API times, warnings/errors."""
    try:
        text = broker.log_path.read_text(errors="replace")
    except OSError:
        return
    lines = text[since:].splitlines()
    lag = logged_loop_lag(broker)
    if lag:
        print(f"  {broker.name}: {lag}", flush=True)
    for api in TXN_APIS:
        found = [x for x in lines if f"request total time {api}:" in x]
        if found:
            print(f"  {broker.name} {found[-1].split('request total time ', 1)[1]}", flush=True)
    commits = [x for x in lines if "group commits" in x]
    if commits:  # its WAL's writes and fsyncs: every transaction waits for some of them
        print(f"  {broker.name} WAL: {commits[-1].split(': ', 2)[-1]}", flush=True)
    bad = [
        x
        for x in lines
        if (" WARNING " in x or " ERROR " in x or " CRITICAL " in x or "Traceback" in x)
        # BrokerProcess runs it with s3.maintenance.runner=none, which it warns about at start
        and "maintenance is off" not in x
    ]
    if bad:
        print(f"  {broker.name} log: {len(bad)} WARNING/ERROR lines, first ones:", flush=True)
        for x in bad[:8]:
            print(f"    {x[:300]}", flush=True)
    else:
        print(f"  {broker.name} log: no WARNING/ERROR lines", flush=True)


def report_tansu_log(broker: Broker, since: int) -> None:
    try:
        text = broker.log_path.read_text(errors="replace")
    except OSError:
        return
    bad = [x for x in text[since:].splitlines() if "ERROR" in x or "WARN" in x or "panic" in x]
    if bad:
        print(f"  {broker.name} log: {len(bad)} ERROR/WARN/panic lines, first ones:", flush=True)
        for x in bad[:8]:
            print(f"    {x[:300]}", flush=True)


def run_broker(broker: Broker, args: argparse.Namespace, results: list[TxResult]) -> None:
    records = args.mib * MiB // args.record_size
    result = TxResult(broker.name, args.partitions, records, args.records_per_txn)
    results.append(result)
    print(f"# {LABELS[broker.name]}: {broker.engine}; log {broker.log_path}", flush=True)
    try:
        since = broker.log_path.stat().st_size
    except OSError:
        since = 0
    try:
        broker.start()
    except Exception as e:  # report and go on with the other brokers
        result.fail("start", e)
        print(f"  {broker.name}: failed to start: {e}\n{broker.log_tail()}", flush=True)
        return
    try:
        if args.warmup_mib > 0:  # not measured: coordinator topic, first-use costs
            warm = TxResult(
                broker.name,
                args.partitions,
                args.warmup_mib * MiB // args.record_size,
                args.records_per_txn,
            )
            topic = f"bench-warmup-{time.monotonic_ns()}"
            try:
                create_topic(broker.bootstrap, topic, warm.partitions)
                produce_txns(
                    broker.bootstrap,
                    topic,
                    f"bench-warmup-{time.monotonic_ns()}",
                    args,
                    warm,
                    bytearray(warm.records),
                    f"{broker.name} warm-up",
                )
            except (KafkaException, RuntimeError) as e:
                warm.fail("warm-up", kafka_error(e))
            if warm.failure:
                print(f"  {broker.name}: warm-up failed: {warm.failure}", flush=True)
        try:
            run_case(broker, args, result)
        except (KafkaException, RuntimeError) as e:
            result.fail("case", kafka_error(e))
        print(f"  {line(result, args.record_size)}", flush=True)
        if result.produce_cores:
            busy = ", ".join(f"{k} {v:.2f}" for k, v in result.produce_cores.items())
            print(f"  {broker.name} cores busy while producing: {busy}", flush=True)
        if result.failure or result.notes:
            tail = "\n    ".join(broker.log_tail(15).splitlines())
            print(f"    {broker.name} log tail:\n    {tail}", flush=True)
    finally:
        code = broker.stop()
        if code != 0:
            result.notes.append(f"broker exit code {code}")
            print(f"  {broker.name} exited with {code}:\n{broker.log_tail()}", flush=True)
        if broker.name.startswith("automq"):
            report_automq_log(broker, since)
        else:
            report_tansu_log(broker, since)


# -- report -------------------------------------------------------------------------------------


def fmt(value: float | None, width: int, digits: int = 1) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def line(r: TxResult, record_size: int) -> str:
    status = f"  [{r.failure}]" if r.failure else ""
    notes = f"  [{'; '.join(r.notes)}]" if r.notes else ""
    read = f"{r.read}" if r.read is not None else "-"
    return (
        f"{LABELS[r.broker]:<15} p={r.partitions}: {fmt(r.records_s, 0, 0)} records/s "
        f"{fmt(r.mbs(record_size), 0)} MB/s {fmt(r.txns_s, 0, 1)} txn/s  commit p50 "
        f"{fmt(r.commit_pct(50), 0, 2)} ms p99 {fmt(r.commit_pct(99), 0, 2)} ms  init "
        f"{fmt(r.init_ms, 0, 1)} ms  committed {r.committed_records}/{r.records} in "
        f"{r.committed_txns} txns ({r.aborted_txns} aborted), {r.delivered} delivered; "
        "AddPartitionsToTxn "
        f"{fmt(r.per_txn('AddPartitionsToTxn'), 0, 2)}/txn, Produce "
        f"{fmt(r.per_txn('Produce'), 0, 2)}/txn; read_committed {read} ({r.read_verdict()}) "
        f"{fmt(r.read_mbs, 0)} MB/s{status}{notes}"
    )


def ratio(a: float | None, b: float | None, width: int) -> str:
    return f"{a / b:{width - 1}.2f}x" if a is not None and b else f"{'-':>{width}}"


def table(results: list[TxResult], args: argparse.Namespace) -> None:
    by_name = {r.broker: r for r in results}
    brokers = [r.broker for r in results]
    ours = [b for b in brokers if b.startswith("automq")]
    theirs = [b for b in brokers if b.startswith("tansu")]
    pairs = [(o, t) for o in ours for t in theirs]
    size = args.record_size
    numeric: list[tuple[str, Callable[[TxResult], float | None], int]] = [
        ("records/s", lambda r: r.records_s, 0),
        ("produce MB/s", lambda r: r.mbs(size), 1),
        ("transactions/s", lambda r: r.txns_s, 1),
        ("commit p50 ms", lambda r: r.commit_pct(50), 2),
        ("commit p99 ms", lambda r: r.commit_pct(99), 2),
        ("init_txns ms", lambda r: r.init_ms, 1),
        ("AddPartitions/txn", lambda r: r.per_txn("AddPartitionsToTxn"), 2),
        ("Produce reqs/txn", lambda r: r.per_txn("Produce"), 2),
        ("read_committed MB/s", lambda r: r.read_mbs, 1),
    ]
    width, ratio_width, label_width = 22, 20, 21
    footnotes: list[str] = []

    def status(r: TxResult) -> str:
        if not r.failure:
            return "ok"
        footnotes.append(f"[{len(footnotes) + 1}] {LABELS[r.broker]}: {r.failure}")
        mark = f" [{len(footnotes)}]"
        step = r.failure.split(": ", 1)[0]  # the step here, what happened in the footnote
        return step[: width - 1 - len(mark)] + mark

    print()
    print(
        f"# summary: {args.records_per_txn} records of {size} B per transaction, "
        f"{args.partitions} partitions, linger.ms={args.linger_ms}; ratio columns: automq-py "
        "<store> / Tansu <engine> (throughput >1 = automq-py faster, latency >1 = automq-py "
        "slower)"
    )
    head = f"{'metric':<{label_width}}" + "".join(f"{LABELS[b]:>{width}}" for b in brokers)
    head += "".join(f"{LABELS[o].split()[-1] + '/' + LABELS[t]:>{ratio_width}}" for o, t in pairs)
    print(head)
    text_rows: list[tuple[str, Callable[[TxResult], str]]] = [
        ("status", status),
        ("committed records", lambda r: f"{r.committed_records}/{r.records}"),
        ("committed txns", lambda r: f"{r.committed_txns}"),
        ("aborted txns", lambda r: f"{r.aborted_txns}"),
        ("read_committed read", lambda r: "-" if r.read is None else str(r.read)),
        ("read check", lambda r: r.read_verdict()),
    ]
    for name, text in text_rows[:1]:
        print(f"{name:<{label_width}}" + "".join(f"{text(by_name[b]):>{width}}" for b in brokers))
    for name, get, digits in numeric:
        row = f"{name:<{label_width}}"
        row += "".join(fmt(get(by_name[b]), width, digits) for b in brokers)
        row += "".join(ratio(get(by_name[o]), get(by_name[t]), ratio_width) for o, t in pairs)
        print(row)
    for name, text in text_rows[1:]:
        print(f"{name:<{label_width}}" + "".join(f"{text(by_name[b]):>{width}}" for b in brokers))
    for note in footnotes:
        print(f"# {note}")
    for r in results:
        for note in r.notes:
            print(f"# {LABELS[r.broker]}: {note}")


# -- main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Brokers: " + ", ".join(f"{b} ({LABELS[b]})" for b in BROKERS),
    )
    parser.add_argument("--mib", type=int, default=64, help="MiB of records per broker (64)")
    parser.add_argument(
        "--records-per-txn",
        type=int,
        default=100,
        help="records per transaction: commit_transaction() after this many (100)",
    )
    parser.add_argument(
        "--abort-every",
        type=int,
        default=0,
        metavar="K",
        help="abort every K-th transaction instead of committing it: the read-back must not "
        "see its records (0: never)",
    )
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the topic (8)")
    parser.add_argument("--record-size", type=int, default=KiB, help="bytes per record (1024)")
    parser.add_argument("--linger-ms", type=int, default=5, help="producer linger.ms (5)")
    parser.add_argument(
        "--brokers", nargs="+", choices=BROKERS, default=list(BROKERS), help="brokers to run"
    )
    parser.add_argument(
        "--warmup-mib",
        type=int,
        default=4,
        help="MiB produced the same way (own topic and transactional.id, not measured) before "
        "the case, per broker (4; 0: none)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300,
        help="seconds allowed to produce everything, and to read it back (300)",
    )
    parser.add_argument(
        "--call-timeout",
        type=float,
        default=30,
        help="seconds allowed to one init_transactions() / commit_transaction() (30)",
    )
    parser.add_argument(
        "--txn-timeout",
        type=float,
        default=60,
        help="the producer's transaction.timeout.ms, in seconds (60)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=1.0,
        help="seconds the reader goes on after the last committed record, to catch extras (1)",
    )
    parser.add_argument(
        "--s3-dir",
        metavar="DIR",
        help="where SeaweedFS keeps its data (default: the work directory); /dev/shm keeps "
        "its writes off the WAL's disk, as with a remote S3",
    )
    parser.add_argument(
        "--broker-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a property for the automq-py brokers (repeatable)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    if args.record_size <= INDEX_BYTES:
        parser.error(f"--record-size must be more than {INDEX_BYTES}")
    if args.records_per_txn < 1 or args.partitions < 1 or args.mib < 1:
        parser.error("--records-per-txn, --partitions and --mib must be at least 1")
    if args.abort_every < 0 or args.abort_every == 1:
        parser.error("--abort-every must be 0 (never) or at least 2")
    return args


def main() -> None:
    args = parse_args()
    brokers: list[str] = args.brokers
    if any(b.startswith("tansu") for b in brokers):
        tansu_binary()
    root = Path(tempfile.mkdtemp(prefix="automq-txn-bench-"))
    results: list[TxResult] = []
    try:
        with seaweedfs(root, any(b.endswith("-s3") for b in brokers), args.s3_dir) as s3:
            if s3 is not None and "tansu-s3" in brokers:
                create_bucket(s3, TANSU_BUCKET)
            print(
                f"# transactional produce bench, {time.strftime('%Y-%m-%d %H:%M')}, "
                f"{os.cpu_count()} cores; {args.mib} MiB of {args.record_size} B records per "
                f"broker, {args.records_per_txn} per transaction, {args.partitions} partitions, "
                f"linger.ms={args.linger_ms}, transactional.id (idempotent, acks=all)",
                flush=True,
            )
            for name in brokers:
                broker: Broker
                store = s3 if name.endswith("-s3") else None
                if name.startswith("automq"):
                    broker = AutomqBroker(name, root / name, store, broker_config(args))
                else:
                    broker = TansuBroker(name, root / name, store)
                run_broker(broker, args, results)
        table(results, args)
    finally:
        # kept when automq-py misbehaved (its logs); Tansu's failures are an expected outcome
        failed = any(r.failure or r.notes for r in results if r.broker.startswith("automq"))
        if args.keep or failed:
            print(f"# work directory kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
