"""Runs Apache Kafka's Java tools and the Java test programs (``tests/java/``) for the tests.

``make java`` (part of ``make test``) resolves ``tests/java/pom.xml`` with Maven and copies each
classpath into ``.java/``: ``kafka-4.4`` (clients, tools, Streams, the broker), ``kafka-3.9``
(clients and Streams 3.9), ``spark-kafka`` (Spark's Kafka connector) and ``kafka-connect``
(Kafka Connect 4.3.1 and MirrorMaker 2); the test programs are in
``.java/build/automq-java-tests.jar``, which also carries the log4j2 configuration of Kafka's
tools (warnings to stderr, stdout left to the program).

A tool is named as Kafka's ``bin/`` script names it (``kafka-topics``) and runs with the main
class that script runs.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.broker import terminate

REPO = Path(__file__).resolve().parents[2]
JAVA_DIR = REPO / ".java"
TEST_PROGRAMS = JAVA_DIR / "build" / "automq-java-tests.jar"

# bin/<script>.sh -> the main class kafka-run-class.sh is given (Kafka 4.4)
TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-configs": "org.apache.kafka.tools.ConfigCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "kafka-broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-features": "org.apache.kafka.tools.FeatureCommand",
    "kafka-cluster": "org.apache.kafka.tools.ClusterTool",
    "kafka-metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
    "kafka-groups": "org.apache.kafka.tools.GroupsCommand",
    "kafka-storage": "kafka.tools.StorageTool",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
}

# Short-lived JVMs: start fast rather than run fast (what matters for a tool run in a test); no
# hsperfdata file in /tmp, which a JVM killed with SIGKILL would leave behind.
QUICK_JVM = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xss1m",
    "-Xmx512m",
    "-XX:-UsePerfData",
)


class JavaSideMissing(RuntimeError):
    """``.java/`` has not been built: ``make java`` (``make test`` runs it) fetches it."""


def classpath(kafka: str = "4.4") -> str:
    """The test programs' jar and every jar of Kafka ``kafka`` ("4.4", "3.9" or "connect")."""
    lib = JAVA_DIR / f"kafka-{kafka}"
    if not TEST_PROGRAMS.is_file() or not lib.is_dir():
        raise JavaSideMissing(f"{lib} or {TEST_PROGRAMS} is missing: run `make java`")
    return os.pathsep.join([str(TEST_PROGRAMS), *sorted(str(j) for j in lib.glob("*.jar"))])


def artifact_name(jar: Path) -> str:
    """``spark-sql-kafka-0-10_2.13-4.2.0.jar`` -> ``spark-sql-kafka-0-10_2.13``: the name as
    Maven's copy-dependencies writes it (artifactId-version.jar), without the version."""
    return re.sub(r"-\d[^-]*\.jar$", "", jar.name)


def spark_kafka_jars() -> list[Path]:
    """The jars of Spark's Kafka connector (``.java/spark-kafka``) that pyspark does not ship:
    those to give ``spark.jars``. pyspark's own (scala-library, hadoop-client, slf4j, ...) stay,
    whatever version the connector's pom asked for, so that one copy of each class is on the
    classpath."""
    lib = JAVA_DIR / "spark-kafka"
    jars = sorted(lib.glob("*.jar"))
    if not jars:
        raise JavaSideMissing(f"{lib} is missing: run `make java`")
    import pyspark  # only the tests that run Spark need it

    bundled = {artifact_name(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [j for j in jars if artifact_name(j) not in bundled]


def java_command(
    main: str, *args: str, kafka: str = "4.4", jvm: Sequence[str] = QUICK_JVM
) -> list[str]:
    return ["java", *jvm, "-cp", classpath(kafka), main, *args]


@dataclass(slots=True, frozen=True)
class ToolRun:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def lines(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.strip()]


def run_tool(
    tool: str,
    *args: str,
    stdin: str | None = None,
    timeout: float = 120,
    check: bool = True,
    kafka: str = "4.4",
) -> ToolRun:
    """Run Kafka's ``bin/<tool>.sh`` equivalent to completion; ``check`` asserts exit code 0."""
    command = java_command(TOOLS[tool], *args, kafka=kafka)
    done = subprocess.run(
        command,
        input=stdin.encode() if stdin is not None else None,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    run = ToolRun(
        [tool, *args],
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )
    return _checked(run, check)


def _checked(run: ToolRun, check: bool) -> ToolRun:
    if check:
        assert run.returncode == 0, (
            f"{' '.join(run.args)} exited with {run.returncode}:\n"
            f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
        )
    return run


# tools that keep static state from one run to the next (a message count, a shutdown latch):
# each run gets a JVM of its own
OWN_JVM = frozenset(
    {
        "kafka-console-producer",
        "kafka-console-consumer",
        "kafka-producer-perf-test",
        "kafka-consumer-perf-test",
    }
)


class ToolRunner:
    """Runs Kafka's tools in one JVM, one after another (``io.automq.tests.ToolRunner``, as
    Kafka's own tool tests run them): the same main classes, arguments, stdin, stdout, stderr
    and exit codes, without a JVM start per run. Tools in ``OWN_JVM`` run as processes of their
    own. A run that outlasts its timeout stops the runner (the next run starts a new one)."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    def run(
        self,
        tool: str,
        *args: str,
        stdin: str | None = None,
        timeout: float = 120,
        check: bool = True,
    ) -> ToolRun:
        if tool in OWN_JVM:
            return run_tool(tool, *args, stdin=stdin, timeout=timeout, check=check)
        process = self._started()
        assert process.stdin is not None and process.stdout is not None
        request = {"main": TOOLS[tool], "args": list(args), "stdin": stdin or ""}
        process.stdin.write(json.dumps(request).encode() + b"\n")
        process.stdin.flush()
        answer: queue.Queue[bytes] = queue.Queue()
        reader = threading.Thread(target=lambda: answer.put(process.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        try:
            line = answer.get(timeout=timeout)
        except queue.Empty:
            self.close(wait=0)
            raise AssertionError(
                f"{tool} {' '.join(args)} did not finish within {timeout}s"
            ) from None
        if not line:
            self.close()
            raise AssertionError(f"the tool runner exited:\n{self._log_tail()}")
        response = json.loads(line)
        return _checked(
            ToolRun([tool, *args], response["code"], response["stdout"], response["stderr"]),
            check,
        )

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
            self._process = subprocess.Popen(
                java_command(
                    "io.automq.tests.ToolRunner",
                    jvm=("-Xmx512m", "-XX:-UsePerfData", "-Djava.security.manager=allow"),
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
            log.close()
        return self._process

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def close(self, wait: float = 10) -> None:
        """End of input stops the runner; SIGKILL if it has not stopped within ``wait``."""
        if self._process is not None:
            if self._process.stdin is not None:
                self._process.stdin.close()
            try:
                self._process.wait(wait)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


class JavaProgram:
    """A long-running Java process whose stdout lines are collected as they come; stderr goes
    to ``log_path``. Stopped (SIGKILL if SIGTERM is not enough) by ``stop()`` or the context
    manager. Its JVM's temporary files (RocksDB's native library, 15 MB, extracted at each
    Kafka Streams start and left behind by a SIGKILL) go to a directory beside the log, not
    to /tmp."""

    def __init__(self, command: list[str], log_path: Path) -> None:
        self.command = command
        self.log_path = log_path
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> JavaProgram:
        scratch = self.log_path.with_name(self.log_path.stem + "-tmp")
        scratch.mkdir(exist_ok=True)
        java, *rest = self.command
        command = [java, f"-Djava.io.tmpdir={scratch}", *rest]
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
        log.close()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for raw in self._process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            self._new.put(line)
        self._new.put(None)

    def wait_for(self, matches: Callable[[str], bool], timeout: float) -> str:
        """The first line from now on that ``matches``; fails on timeout or exit."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching line within {timeout}s:\n{self.log_tail()}")
            try:
                line = self._new.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"the program exited:\n{self.log_tail()}")
            if matches(line):
                return line

    def wait(self, timeout: float) -> int:
        assert self._process is not None
        return self._process.wait(timeout)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the program dies at an arbitrary moment, as in a crash."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._finish()

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (the JVM's shutdown hooks run), SIGKILL after ``timeout``."""
        if self._process is None:
            return None
        code = terminate(self._process, timeout)
        self._finish()
        return code

    def _finish(self) -> None:
        if self._reader is not None:
            self._reader.join(5)
        self._process = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            err = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            err = []
        return "stdout:\n" + "\n".join(self.lines[-lines:]) + "\nstderr:\n" + "\n".join(err)

    def __enter__(self) -> JavaProgram:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
