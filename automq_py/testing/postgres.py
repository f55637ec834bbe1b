"""PostgresServer: a throwaway PostgreSQL server for a test cluster's metadata.

It runs the server programs of an installed PostgreSQL (Debian's
``/usr/lib/postgresql/<version>/bin``, else ``initdb`` and ``pg_ctl`` on ``PATH``), with its
files in a directory of its own in the system's temporary directory, on 127.0.0.1 at a free
port, its socket in that directory, and trust authentication. ``initdb`` refuses to run as
root, so under root the files belong to the ``postgres`` user (which Debian's package creates)
and the programs run through ``runuser``. ``stop()`` stops the server and removes the
directory; so does interpreter exit, for a server still running then.

    with PostgresServer() as server:
        url = server.create_database("metadata")  # postgresql://automq@127.0.0.1:PORT/metadata
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from automq_py.testing.process import AutoMQError, free_port

USER = "automq"
_DEBIAN_BIN_DIRS = "/usr/lib/postgresql/*/bin"
_PROGRAMS = ("initdb", "pg_ctl", "createdb")
_live: set[PostgresServer] = set()


def find_bin_dir() -> Path:
    """The directory holding PostgreSQL's server programs: the newest Debian version, else the
    one on ``PATH``. Raises :class:`AutoMQError` saying what to install."""
    debian = sorted(
        (Path(path) for path in glob.glob(_DEBIAN_BIN_DIRS)),
        key=lambda path: [int(n) for n in re.findall(r"\d+", path.parent.name)],
    )
    for candidate in reversed(debian):
        if all((candidate / program).exists() for program in _PROGRAMS):
            return candidate
    initdb = shutil.which("initdb")
    if initdb is not None and all(shutil.which(program) for program in _PROGRAMS):
        return Path(initdb).parent
    raise AutoMQError(
        "a test cluster keeps its metadata in PostgreSQL, whose server programs "
        f"({', '.join(_PROGRAMS)}) are in neither {_DEBIAN_BIN_DIRS} nor PATH: install "
        "them (Debian/Ubuntu: apt-get install postgresql; the server need not run)"
    )


class PostgresServer:
    """One PostgreSQL server on ``127.0.0.1:<port>``, superuser ``automq`` without a password."""

    def __init__(
        self, *, bin_dir: str | os.PathLike[str] | None = None, keep_directory: bool = False
    ) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir is not None else find_bin_dir()
        self.keep_directory = keep_directory
        self.port: int | None = None
        self.directory: Path | None = None
        self._as_postgres = os.geteuid() == 0
        self.running = False

    @property
    def data_dir(self) -> Path:
        return self._root / "data"

    @property
    def log_path(self) -> Path:
        return self._root / "server.log"

    @property
    def _root(self) -> Path:
        if self.directory is None:
            raise AutoMQError("PostgreSQL has not been started")
        return self.directory

    def start(self) -> PostgresServer:
        """initdb, then start the server and wait until it takes connections. On failure the
        directory is removed and :class:`AutoMQError` carries the server's log."""
        if self.running:
            raise AutoMQError("PostgreSQL is already running")
        # in the system's temporary directory: under root, the postgres user must reach it
        self.directory = Path(tempfile.mkdtemp(prefix="automq-py-pg-"))
        try:
            self._init()
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _init(self) -> None:
        root = self._root
        root.chmod(0o755)
        if self._as_postgres:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise AutoMQError(
                    "running as root, PostgreSQL's initdb needs the 'postgres' user (which "
                    "Debian's postgresql package creates) to own the server's files"
                ) from None
            shutil.chown(root, "postgres", "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def pause(self) -> None:
        """Take the server away at once (``immediate``, as if its machine went down), keeping
        its data and port: :meth:`resume` brings it back. For tests of a database outage."""
        if self.running:
            stop = ("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
            self._run(*stop, check=False)
            self.running = False

    def resume(self) -> None:
        """Start a paused server again, on the same port, with its data."""
        if not self.running:
            self._start(port=self.port)

    def _start(self, port: int | None = None) -> None:
        # a probed free port can be taken before the server binds it: try a few others
        for _attempt in range(3):
            self.port = port if port is not None else free_port()
            # a test database: durability across an operating-system crash is not needed, but
            # across the server's own (pause() kills it) it is: commits reach the WAL file
            options = (
                f"-p {self.port} -k {self._root} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c full_page_writes=off"
            )
            started = self._run(
                "pg_ctl",
                "-D",
                str(self.data_dir),
                "-o",
                options,
                "-l",
                str(self.log_path),
                "-w",
                "-t",
                "60",
                "start",
                check=False,
            )
            if started.returncode == 0:
                self.running = True
                _live.add(self)
                return
            if "already in use" not in self.log_tail().lower():
                break
        raise AutoMQError(f"PostgreSQL did not start:\n{started.stderr}\n{self.log_tail()}")

    def create_database(self, name: str) -> str:
        """A new empty database; its ``postgresql://`` URL."""
        if not self.running:
            raise AutoMQError("PostgreSQL is not running")
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name)
        return self.url(name)

    def url(self, database: str) -> str:
        """``postgresql://automq@127.0.0.1:<port>/<database>``, for ``metadata.store.url``."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        """Stop the server (``fast``: connections are closed, nothing is kept for a restart)
        and remove its directory unless ``keep_directory``. Calling it again does nothing."""
        if self.running:
            stop = ("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30", "stop")
            self._run(*stop, check=False)
            self.running = False
        _live.discard(self)
        if self.directory is not None and not self.keep_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the server's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, AutoMQError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _run(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / program), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(
            command,
            cwd=self._root,  # the postgres user may not enter the caller's directory
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise AutoMQError(f"{program} exited with {done.returncode}:\n{done.stderr}")
        return done

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"PostgresServer({self.port}, {state}, {str(self.directory)!r})"


@atexit.register
def _stop_all() -> None:
    # pg_ctl starts the server detached: without this it would outlive an interrupted session
    for server in list(_live):
        server.stop()
