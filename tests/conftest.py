"""Shared fixtures: a real S3 server (SeaweedFS) and a real PostgreSQL for the session, and
object stores and metadata databases on them."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TextIO

import pytest
from hypothesis import HealthCheck, settings

from storage.operator import LocalObjectStore, S3ObjectStore
from tests.support.postgres import PostgresServer
from tests.support.seaweedfs import SeaweedFS

# CI machines are small and shared: time limits per example would make fuzz tests flaky.
settings.register_profile(
    "automq", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("automq")

# Under pytest-xdist each worker is its own session with its own SeaweedFS: give each worker a
# block of 1,000 ports (a test starts extra servers up to 300 above the base).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    os.environ["AUTOMQ_TEST_S3_BASE_PORT"] = str(
        int(os.environ.get("AUTOMQ_TEST_S3_BASE_PORT", "18300")) + 1000 * int(_WORKER[2:])
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The image and compose tests share podman's store and images: under pytest-xdist's
    ``--dist loadgroup`` they all run on one worker, one after another."""
    for item in items:
        if "tests/docker/" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("podman"))


# pytest-timeout's signal fails a test that runs past ``timeout`` (300 s), but only once the main
# thread is back in Python: a client's C library blocking in a close, or a fixture's teardown
# hanging after the timeout has fired, would hold the whole run to CI's limit with nothing said.
HUNG_TEST_S = 600
# The same a minute later from faulthandler's own thread, which needs no GIL: a thread stuck in C
# with the GIL held (a client library's callback) keeps every Python thread from running.
GIL_HELD_S = HUNG_TEST_S + 60
EXIT_GRACE_S = 120  # a process that has not exited this long after its session finished
_REAL_STDERR: list[TextIO] = []  # fd 2 as it is between tests, outside pytest's capture


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """A test whose setup, call and teardown together pass ``HUNG_TEST_S`` gets every thread's
    stack written to the real standard error and its process ended: pytest-xdist reports the
    test as crashed, starts a new worker and the run goes on."""
    if not _REAL_STDERR:  # (capture is suspended between tests: fd 2 is the real one here)
        _REAL_STDERR.append(os.fdopen(os.dup(2), "w"))
    faulthandler.dump_traceback_later(GIL_HELD_S, exit=True, file=_REAL_STDERR[0])
    watchdog = threading.Timer(HUNG_TEST_S, _hung, args=(item,))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(exitstatus: int) -> None:
    """A process that has not exited ``EXIT_GRACE_S`` after its session finished (a thread a
    test left behind that the interpreter waits for) writes its threads' stacks and exits with
    the session's status."""
    watchdog = threading.Timer(EXIT_GRACE_S, _stuck_at_exit, args=(int(exitstatus),))
    watchdog.daemon = True
    watchdog.start()


def _stuck_at_exit(exitstatus: int) -> None:
    _dump_threads(f"still running {EXIT_GRACE_S} s after the session finished")
    os._exit(exitstatus)


def _dump_threads(why: str) -> None:
    sys.stderr.write(f"\n{why}; its threads:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()


def _hung(item: pytest.Item) -> None:
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=False)
    _dump_threads(f"{item.nodeid} still running after {HUNG_TEST_S} s")
    for pid in reversed(_descendants(os.getpid())):  # its brokers and servers go with it
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    temporary = getattr(item.config, "_tmp_path_factory", None)  # (set by pytest's tmp_path)
    if temporary is not None:  # the session's fixture that would remove them will not run
        _remove_large_files(temporary.getbasetemp())
    os._exit(70)


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid``, parents before their children (from /proc)."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    kids = [int(child) for child in children.read().split()]
            except OSError:
                continue
            found.extend(kids)
            pending.extend(kids)
    return found


LARGE_FILE = 16 << 20  # a broker's preallocated WAL (256 MiB in tests), SeaweedFS's volumes


@pytest.fixture(scope="session", autouse=True)
def no_large_files_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """At the session's end, delete the large files under its temporary directory. pytest
    removes that directory after a passing session but keeps all of it after a failure
    (``tmp_path_retention_policy = failed``): the logs a failure is read from, and beside them
    every broker's preallocated WAL, 12 GB of them after one failed test."""
    yield
    _remove_large_files(tmp_path_factory.getbasetemp())


def _remove_large_files(directory: str | os.PathLike[str]) -> None:
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            try:
                if not os.path.islink(path) and os.path.getsize(path) >= LARGE_FILE:
                    os.unlink(path)
            except OSError:
                continue


@pytest.fixture(scope="session", autouse=True)
def bytecode_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where the environment says not to write bytecode (PYTHONDONTWRITEBYTECODE), the Python
    processes the tests start (every broker, the CLI, Spark's workers) keep theirs for the
    session in one temporary directory: each broker start otherwise compiled its ~120 modules
    again (0.9 s -> 0.6 s to listen)."""
    saved = os.environ.get("PYTHONDONTWRITEBYTECODE")
    if saved is None or "PYTHONPYCACHEPREFIX" in os.environ:
        yield
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    try:
        yield
    finally:
        del os.environ["PYTHONPYCACHEPREFIX"]
        os.environ["PYTHONDONTWRITEBYTECODE"] = saved


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One SeaweedFS for the whole session; a failure to start fails the tests using it."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server (Debian's) for the whole session; each test takes a database."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A new empty database on the session's PostgreSQL."""
    return postgres_server.create_database()


@pytest.fixture
async def s3_store(s3_server: SeaweedFS) -> AsyncIterator[tuple[S3ObjectStore, str]]:
    """An S3ObjectStore on the session's server and a key prefix no other test uses."""
    store = S3ObjectStore(
        s3_server.bucket,
        endpoint=s3_server.endpoint,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        path_style=True,
    )
    try:
        yield store, f"test-{uuid.uuid4().hex[:12]}/"
    finally:
        await store.close()


@pytest.fixture
async def local_store(tmp_path: Path) -> AsyncIterator[LocalObjectStore]:
    """A LocalObjectStore in the test's temporary directory."""
    store = LocalObjectStore(tmp_path / "objects")
    try:
        yield store
    finally:
        await store.close()
