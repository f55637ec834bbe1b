"""Runs the real broker process (``python -m automq_py serve``) for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from automq_py.testing import process

REPO = Path(__file__).resolve().parents[2]


def terminate(process: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM (unless it has exited), SIGKILL after ``timeout``; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def free_port() -> int:
    return process.free_port()


class BrokerProcess:
    """One broker on loopback with its own data directory; restartable on the same data."""

    def __init__(
        self,
        data_dir: Path,
        overrides: dict[str, str] | None = None,
        *,
        own_session: bool = False,
    ) -> None:
        """``own_session``: the process leads a session of its own, as a service a supervisor
        starts does; on Linux that is also a scheduling group of its own (autogroup), so the
        broker and the processes beside it share the cores as separate programs, not as
        threads of one."""
        self.data_dir = data_dir
        self.own_session = own_session
        self.port = free_port()
        self.overrides = {
            "log.dirs": str(data_dir),
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            # the WAL file is preallocated: 2 GiB per test broker would fill CI's disk; and
            # allocated only, not written with zeros (0.6 s of disk writes per broker)
            "s3.wal.capacity": str(256 << 20),
            "s3.wal.init.zero": "false",
            # nor is the memory of its caches faulted in at start: ~0.5 s of CPU per broker
            "s3.cache.pretouch": "false",
            # the broker's own compaction/retention/GC (a Spark JVM every interval) only where
            # a test asks for it: on two cores it would compete with the clients under test
            "s3.maintenance.runner": "none",
            **(overrides or {}),
        }
        if overrides and "listeners" in overrides:
            # the first listener's port: where readiness is checked and clients bootstrap
            self.port = int(overrides["listeners"].split(",")[0].rsplit(":", 1)[1])
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """Started and not exited."""
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 30) -> None:
        """Start the process and wait until it listens."""
        self.start_process()
        assert self._process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"broker exited with {self._process.returncode}:\n{self.log_tail()}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                # polled often: every test waits for this, and the broker listens in ~0.6 s
                time.sleep(0.02)
        raise RuntimeError(f"broker did not listen within {timeout}s:\n{self.log_tail()}")

    def start_process(self) -> None:
        """Start the process, without waiting for anything."""
        args = [sys.executable, "-m", "automq_py", "serve"]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self._process = subprocess.Popen(
            args,
            cwd=REPO,
            stdout=log,
            stderr=log,
            env=os.environ,
            start_new_session=self.own_session,
        )

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM and wait for the graceful shutdown; returns the exit code."""
        if self._process is None:
            return 0
        code = terminate(self._process, timeout)
        self._process = None
        return code

    def kill(self) -> None:
        """SIGKILL: a crash at an arbitrary moment."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class SettableSession:
    """A cluster broker's session as its replica manager asks it (``ReplicaManager.session``),
    set by the test: in session, or not (frozen, cut off), and fenced or not."""

    def __init__(self) -> None:
        self.current = True
        self.fenced = False

    def in_session(self) -> bool:
        return self.current
