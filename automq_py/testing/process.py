"""AutoMQProcess: one throwaway broker (``python -m automq_py serve``) for a test suite.

The broker runs embedded (file WAL, objects in a local directory, SQLite metadata) in its own
directory, listens on a free loopback port and is sized for tests: a 64 MiB WAL instead of the
2 GiB default, not zero-filled, no background compaction. ``stop()`` sends SIGTERM (SIGKILL
after a timeout) and removes the directory; ``kill()`` sends SIGKILL and keeps it, for a
restart on the same data. Each process is a cluster of its own unless its properties join it
to one (``AutoMQCluster`` in ``cluster.py``).

    with AutoMQProcess({"num.partitions": "3"}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

MiB = 1 << 20

# What makes a test broker cheap and quick; a property the caller passes wins.
TEST_PROPERTIES: Mapping[str, str] = {
    # the WAL file is preallocated in full: 2 GiB per broker fills a CI disk fast
    "s3.wal.capacity": str(64 * MiB),
    # ... and allocated only, not written with zeros: a quicker start
    "s3.wal.init.zero": "false",
    # the caches' memory faulted in as they fill, not all at start (resident from the start)
    "s3.cache.pretouch": "false",
    # compaction, retention and GC run on timers (a Spark JVM each time when pyspark is there)
    "s3.maintenance.runner": "none",
    # a new consumer group starts at once, as in Kafka's own test containers
    "group.initial.rebalance.delay.ms": "0",
}

# The broker refuses an upload threshold above half the WAL; with a small WAL, upload sooner.
_UPLOAD_THRESHOLD = 16 * MiB

# The process owns these: they follow from ``directory`` and ``port``.
_RESERVED = ("listeners", "log.dirs", "log.dir")


class AutoMQError(RuntimeError):
    """The broker did not start, or did not stop cleanly; the message ends with its log."""


# Under pytest-xdist, worker gwN takes its ports from its own block below the kernel's
# ephemeral range (32768 on): a port the kernel hands to bind(0) in one worker can be handed to
# another worker before the first binds it, or be a client connection's own port, and a broker
# that then found its port taken left its test talking to another test's broker.
_WORKER_PORTS = (10000, 1000, 8)  # first port, ports per worker, workers with a block
_next_port: int | None = None


def port_free(port: int) -> bool:
    """Whether a listener could bind ``port`` on loopback now (with SO_REUSEADDR, as listeners
    bind: a port whose connections closed lately, in TIME_WAIT, counts as free)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port nothing listens on now (the broker binds it a moment later)."""
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    first, size, blocks = _WORKER_PORTS
    if worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < blocks:
        start = first + size * int(worker[2:])
        if _next_port is None:
            _next_port = start + os.getpid() % size  # a restarted worker starts elsewhere
        for _ in range(size):
            port = start + (_next_port - start) % size
            _next_port = port + 1
            if port_free(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_free(port: int) -> None:
    if not port_free(port):
        raise AutoMQError(f"port {port} is taken")


def with_test_defaults(properties: Mapping[str, str | int] | None = None) -> dict[str, str]:
    """:data:`TEST_PROPERTIES` under ``properties``, with an upload threshold that fits the WAL
    unless ``s3.wal.upload.threshold`` is given."""
    merged = {**TEST_PROPERTIES, **{k: str(v) for k, v in (properties or {}).items()}}
    if "s3.wal.upload.threshold" not in merged:
        try:
            capacity = int(merged["s3.wal.capacity"])
        except ValueError:
            capacity = 0  # the broker names the bad value when it starts
        if capacity >= 2:
            merged["s3.wal.upload.threshold"] = str(min(_UPLOAD_THRESHOLD, capacity // 2))
    return merged


class AutoMQProcess:
    """A broker subprocess on ``127.0.0.1:<port>`` with its data under ``directory``.

    ``properties`` are broker properties (``num.partitions``, ``s3.wal.capacity``, ...) over
    :data:`TEST_PROPERTIES`; ``listeners`` and ``log.dirs`` are set from ``port`` and
    ``directory``. Without ``directory`` a temporary one is made. The directory belongs to
    the broker: ``stop()`` removes it unless ``keep_directory``. The broker's log is
    ``directory/broker.log``.
    """

    def __init__(
        self,
        properties: Mapping[str, str | int] | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
        port: int | None = None,
        keep_directory: bool = False,
        start_timeout: float = 60.0,
        stop_timeout: float = 30.0,
    ) -> None:
        reserved = [name for name in _RESERVED if name in (properties or {})]
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)}: set by AutoMQProcess; pass port= or directory= instead"
            )
        self.properties = with_test_defaults(properties)
        self.directory = Path(
            directory if directory is not None else tempfile.mkdtemp(prefix="automq-py-")
        )
        self.port = port
        self.keep_directory = keep_directory
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._fixed_port = port is not None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        """``log.dirs``: the WAL (``wal/``), ``metadata.db`` and the objects (``objects/``)."""
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "broker.log"

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``, for ``bootstrap.servers``."""
        if self.port is None:
            raise AutoMQError("the broker has not been started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> AutoMQProcess:
        """Start the broker and wait until it accepts connections (it opens its listener
        last, once storage and the group coordinator are up). On failure the directory is
        removed as by :meth:`stop` and :class:`AutoMQError` carries the broker's log."""
        if self._process is not None:
            raise AutoMQError("the broker is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        if self._fixed_port:
            assert self.port is not None
            _check_free(self.port)
        # A probed free port can be taken before the broker binds it: try a few others. A
        # restarted broker tries its previous port first, so its address stays the same.
        for attempt in range(3):
            if not self._fixed_port and (attempt > 0 or self.port is None):
                self.port = free_port()
            log_start = self._log_size()
            if self._launch(log_start):
                return
            log = self._log_text(log_start).lower()
            if self._fixed_port or "address already in use" not in log:
                break
        raise AutoMQError(f"the broker did not start:\n{self.log_tail()}")

    def _launch(self, log_start: int) -> bool:
        """Run the process; True once it listens, False (and reaped) if it exited first.

        Ready means the broker logged that it listens (in the log written from ``log_start``
        on: an earlier run's line does not count) and a connection succeeds: a connection
        alone could reach another program that took the port."""
        args = [sys.executable, "-m", "automq_py", "serve"]
        overrides = {
            **self.properties,
            "log.dirs": str(self.data_dir),
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
        }
        for key, value in overrides.items():
            args += ["--override", f"{key}={value}"]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                args, cwd=self.directory, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        listening = f"listening on 127.0.0.1:{self.port}"
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            if listening in self._log_text(log_start):
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                    return True
                except OSError:
                    pass
            time.sleep(0.05)
        self._terminate()
        raise AutoMQError(
            f"the broker did not listen within {self.start_timeout} s:\n{self.log_tail()}"
        )

    def stop(self, *, check: bool = False) -> int | None:
        """SIGTERM, wait up to ``stop_timeout`` for the graceful shutdown, else SIGKILL; then
        remove the directory (unless ``keep_directory``). Returns the exit code (None if it
        was not running); with ``check`` a code other than 0 raises :class:`AutoMQError`.
        Calling it again does nothing."""
        code = self._terminate()
        failed = check and code not in (0, None)
        tail = self.log_tail() if failed else ""  # read before the directory goes
        if not self.keep_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        if failed:
            raise AutoMQError(f"the broker on port {self.port} exited with {code}:\n{tail}")
        return code

    def kill(self) -> int | None:
        """SIGKILL, as a crash would end it; the directory stays, so :meth:`start` restarts
        the broker on the same data (and port) and a later :meth:`stop` removes it. Returns
        the exit code (None if it was not running)."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
        return process.wait()

    def _terminate(self) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the broker's log."""
        return "\n".join(self._log_text().splitlines()[-lines:])

    def _log_text(self, start: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(start)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def __enter__(self) -> AutoMQProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"AutoMQProcess({self.port}, {state}, {str(self.directory)!r})"
