"""PostgreSQL: a private server from Debian's packages, for the cluster-metadata tests.

``initdb`` refuses to run as root, so when the tests run as root the server's files belong to
the ``postgres`` user and its commands run through ``runuser``. The server listens on 127.0.0.1
at a free port with its socket in its own directory, trusts local connections, and is stopped
(``immediate``) and its directory removed by ``stop()``, the context manager or at interpreter
exit. ``stop()`` then ``start()`` again keeps the data: it is how a test takes the database away
for a while.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from types import TracebackType
from typing import Self

START_TIMEOUT_S = 30.0
_live: set[PostgresServer] = set()


def _bin_dir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is missing: `make deps` installs Debian's postgresql")
    return os.path.dirname(found[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server in a temporary directory."""

    def __init__(self) -> None:
        self._bin = _bin_dir()
        self.root = tempfile.mkdtemp(prefix="automq-pg-")
        os.chmod(self.root, 0o755)  # the postgres user must enter it
        self.data_dir = os.path.join(self.root, "data")
        self.port = _free_port()
        self.user = "automq"
        self._as_postgres = os.geteuid() == 0
        self.running = False

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [os.path.join(self._bin, args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=60)

    def init(self) -> Self:
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            "initdb",
            "-D",
            self.data_dir,
            "-U",
            self.user,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        return self

    def start(self) -> None:
        """Start (or restart) the server and wait until it takes connections."""
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on "
            "-c max_connections=200"
        )
        log_file = os.path.join(self.root, "server.log")
        self._run("pg_ctl", "-D", self.data_dir, "-o", options, "-l", log_file, "-w", "start")
        self.running = True
        _live.add(self)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            ready = self._run("pg_isready", "-h", "127.0.0.1", "-p", str(self.port), check=False)
            if ready.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start: {self.log_tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server at once (``immediate``: as if it had gone away); keep its data."""
        if self.running:
            self._run("pg_ctl", "-D", self.data_dir, "-m", "immediate", "-w", "stop", check=False)
            self.running = False

    def destroy(self) -> None:
        self.stop()
        _live.discard(self)
        shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its ``postgresql://`` URL."""
        name = name or f"meta_{uuid.uuid4().hex[:12]}"
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name)
        return self.url(name)

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.root, "server.log")) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        self.init()
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.destroy()
