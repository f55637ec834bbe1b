"""Apache Kafka 4.4 as the benches' peer: a single-node KRaft broker and its producer perf tool.

Both run from the jars ``make java`` puts in ``.java/kafka-4.4/`` (``tests/support/java.py``'s
``classpath()``), as Kafka's ``bin/`` scripts run them:

* ``KafkaServer`` is the KRaft quickstart: a ``server.properties`` with
  ``process.roles=broker,controller`` on two free loopback ports of its own, ``log.dirs`` in its
  work directory, ``kafka-storage format --standalone``, then ``kafka.Kafka server.properties``
  with the JVM options ``kafka-server-start.sh`` gives (``-Xmx1G -Xms1G``,
  ``KAFKA_JVM_PERFORMANCE_OPTS``: G1 with 20 ms pauses, the GC log ``-loggc`` asks for; and
  ``-XX:-UsePerfData``) and a log4j2 configuration writing ``server.log`` in the work
  directory. Ready when a metadata request lists the broker; stopped with SIGTERM (a
  controlled shutdown, SIGKILL after
  ``STOP_TIMEOUT_S``). ``flush_every_message`` adds ``log.flush.interval.messages=1``: each
  append is fsynced before the broker answers it. As shipped, Kafka leaves that to the OS.
* ``run_producer_perf`` runs ``kafka-producer-perf-test`` (``ProducerPerformance``) and
  ``parse_perf_summary`` reads its summary line.
"""

from __future__ import annotations

import atexit
import base64
import re
import resource
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.support.broker import terminate
from tests.support.java import QUICK_JVM, TOOLS, classpath

KAFKA = "4.4"
NODE_ID = 1
START_TIMEOUT_S = 120.0  # a JVM start and a KRaft election on a busy 2-core machine
STOP_TIMEOUT_S = 60.0
# kafka-server-start.sh's KAFKA_HEAP_OPTS and kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS
SERVER_HEAP = ("-Xmx1G", "-Xms1G")
JVM_PERFORMANCE_OPTS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
)
PERF_HEAP = ("-Xmx512M",)  # kafka-producer-perf-test.sh's KAFKA_HEAP_OPTS
# Beyond the scripts': no hsperfdata file in /tmp (jstat's counters), which a JVM killed with
# SIGKILL would leave behind, as the tests' JVMs (tests/support/java.py).
NO_PERF_DATA = "-XX:-UsePerfData"
# The JVM exits with 128 + the signal after its shutdown hooks (Kafka's controlled shutdown) ran.
CLEAN_EXITS = (0, 128 + signal.SIGTERM)

_live: set[subprocess.Popen[bytes]] = set()


def _stop(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM, SIGKILL after ``timeout``; the exit code."""
    _live.discard(process)
    return terminate(process, timeout)


@atexit.register
def _stop_all() -> None:
    for process in list(_live):
        _stop(process)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_cluster_id() -> str:
    """A cluster id as ``kafka-storage random-uuid`` prints one: 16 random bytes, url-safe
    base64 without padding, never starting with '-' (a command line would read an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def server_properties(
    port: int, controller_port: int, log_dir: Path, flush_every_message: bool
) -> dict[str, str]:
    """The KRaft quickstart's ``config/server.properties`` on loopback ports, for one node."""
    props = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": (
            f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}"
        ),
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",  # as automq-py's default; the benches name a count anyway
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    if flush_every_message:
        props["log.flush.interval.messages"] = "1"
    return props


# Kafka's config/log4j2.yaml in short: INFO to server.log under kafka.logs.dir (one file, not
# its five), the request loggers at WARN.
LOG4J2 = """\
status = error
appender.server.type = File
appender.server.name = SERVER
appender.server.fileName = ${sys:kafka.logs.dir}/server.log
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.server.ref = SERVER
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.channel.name = kafka.network.RequestChannel$
logger.channel.level = warn
"""


class KafkaServer:
    """One Kafka 4.4 node (broker and controller) on 127.0.0.1 with its data under ``workdir``.

    ``start()`` formats the log directory the first time; a stopped server starts again on the
    same ports and data. ``remove()`` stops it and deletes ``workdir``."""

    def __init__(self, workdir: Path, flush_every_message: bool = False) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.controller_port = free_port()
        self.log_dir = workdir / "data"
        self.log_path = workdir / "server.log"
        self.console_path = workdir / "kafka.out"  # the JVM's own stdout/stderr
        self.flush_every_message = flush_every_message
        self.cluster_id = random_cluster_id()
        self._config = workdir / "server.properties"
        self._log4j = workdir / "log4j2.properties"
        self._process: subprocess.Popen[bytes] | None = None
        self._formatted = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The JVM's process id: all of the broker's threads, its CPU time included."""
        return self._process.pid if self._process is not None else None

    def _format(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        props = server_properties(
            self.port, self.controller_port, self.log_dir, self.flush_every_message
        )
        self._config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self._log4j.write_text(LOG4J2)
        args = ["format", "-t", self.cluster_id, "-c", str(self._config), "--standalone"]
        done = subprocess.run(
            ["java", *QUICK_JVM, "-cp", classpath(KAFKA), TOOLS["kafka-storage"], *args],
            capture_output=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")
            raise RuntimeError(f"kafka-storage format exited with {done.returncode}:\n{output}")
        self._formatted = True

    def command(self) -> list[str]:
        # kafka-server-start.sh's -loggc
        gc_log = f"-Xlog:gc*:file={self.workdir}/kafkaServer-gc.log:time,tags"
        gc_log += ":filecount=10,filesize=100M"
        return [
            "java",
            *SERVER_HEAP,
            *JVM_PERFORMANCE_OPTS,
            NO_PERF_DATA,
            gc_log,
            f"-Dkafka.logs.dir={self.workdir}",
            f"-Dlog4j2.configurationFile={self._log4j}",
            "-cp",
            classpath(KAFKA),
            "kafka.Kafka",
            str(self._config),
        ]

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        if not self._formatted:
            self._format()
        with open(self.console_path, "ab") as console:
            # a session of its own: Ctrl-C reaches the bench, which then stops Kafka in order
            self._process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _live.add(self._process)
        try:
            self._await_ready(timeout)
        except BaseException:  # a timeout, a failed start or Ctrl-C: leave no JVM behind
            self.stop()
            raise

    def _await_ready(self, timeout: float) -> None:
        """Until a metadata request lists this node: the listener accepts connections ~1 s
        before the broker is unfenced and answers."""
        assert self._process is not None
        deadline = time.monotonic() + timeout
        admin: AdminClient | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"kafka exited with {self._process.returncode}")
            if admin is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                except OSError:
                    time.sleep(0.1)
                    continue
                admin = AdminClient({"bootstrap.servers": self.bootstrap})
            try:
                if NODE_ID in admin.list_topics(timeout=2).brokers:
                    return
            except KafkaException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"kafka did not answer a metadata request within {timeout:g}s")

    def stop(self) -> int:
        """SIGTERM: Kafka's controlled shutdown. 0 when it ran to the end."""
        if self._process is None:
            return 0
        code = _stop(self._process)
        self._process = None
        return 0 if code in CLEAN_EXITS else code

    def remove_data(self) -> None:
        """Stop, and delete the log directory (the records); the logs stay in ``workdir``."""
        self.stop()
        shutil.rmtree(self.log_dir, ignore_errors=True)
        self._formatted = False

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of ``server.log``, and of the JVM's console output if it has any."""
        parts = []
        for path in (self.log_path, self.console_path):
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            if text:
                parts.append("\n".join(text))
        return "\n".join(parts)


# -- kafka-producer-perf-test -------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class PerfSummary:
    """ProducerPerformance's summary line. Its latencies are whole milliseconds from each
    send() call to its callback; its MB/sec is MiB (2^20 bytes) per second."""

    records: int
    records_per_s: float
    mib_per_s: float
    avg_ms: float
    max_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    steady_state: bool  # measured after --warmup-records


SUMMARY = re.compile(
    r"(?P<records>\d+) (?P<steady>steady state )?records sent, "
    r"(?P<rate>[\d.]+) records/sec \((?P<mib>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, "
    r"(?P<p50>\d+) ms 50th, (?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99.9th"
)


def parse_perf_summary(output: str) -> PerfSummary | None:
    """The steady-state summary if the run had warm-up records, else the whole run's; None if
    the output has neither (the periodic progress lines carry no percentiles)."""
    found: list[PerfSummary] = []
    for m in SUMMARY.finditer(output):
        found.append(
            PerfSummary(
                records=int(m["records"]),
                records_per_s=float(m["rate"]),
                mib_per_s=float(m["mib"]),
                avg_ms=float(m["avg"]),
                max_ms=float(m["max"]),
                p50_ms=float(m["p50"]),
                p95_ms=float(m["p95"]),
                p99_ms=float(m["p99"]),
                p999_ms=float(m["p999"]),
                steady_state=m["steady"] is not None,
            )
        )
    steady = [s for s in found if s.steady_state]
    last = steady or found
    return last[-1] if last else None


@dataclass(slots=True, frozen=True)
class PerfRun:
    summary: PerfSummary | None
    returncode: int | None  # None: killed at the timeout
    output: str  # stdout: progress and summary lines
    stderr: str  # warnings, and the stack trace of each failed send
    cpu_s: float  # the tool's JVM: user + system CPU seconds


def producer_perf_command(
    bootstrap: str,
    topic: str,
    records: int,
    record_size: int,
    records_per_s: float | None,
    warmup_records: int,
    properties: dict[str, str],
) -> list[str]:
    """``kafka-producer-perf-test.sh`` with these arguments, as the script runs it. The JVM is
    asked for English number formats: the summary is parsed."""
    args = [
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(records + warmup_records),
        "--record-size",
        str(record_size),
        "--throughput",
        f"{records_per_s:.0f}" if records_per_s else "-1",
        "--command-property",
        *(f"{k}={v}" for k, v in properties.items()),
    ]
    if warmup_records:
        args += ["--warmup-records", str(warmup_records)]
    jvm = [
        *PERF_HEAP,
        *JVM_PERFORMANCE_OPTS,
        NO_PERF_DATA,
        "-Duser.language=en",
        "-Duser.country=US",
    ]
    return [
        "java",
        *jvm,
        "-cp",
        classpath(KAFKA),
        TOOLS["kafka-producer-perf-test"],
        *args,
    ]


def run_producer_perf(command: list[str], stderr_path: Path, timeout: float) -> PerfRun:
    """Run the tool to its end (killed after ``timeout``); its stderr is also appended to
    ``stderr_path``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code: int | None
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:  # run() has killed and reaped it
        code, out, err = None, e.stdout or b"", e.stderr or b""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(stderr_path, "ab") as log:
        log.write(err)
    output = out.decode(errors="replace")
    return PerfRun(parse_perf_summary(output), code, output, err.decode(errors="replace"), cpu)
