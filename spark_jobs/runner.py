"""Run planned units of work on Spark (any master) or in this process, with a progress bar.

A *unit* is one planned piece of compaction, retention or GC work: a picklable argument
for a module-level function that reads and writes object storage and returns a small
picklable result. The planners in ``storage/`` make the units, a :class:`Runner` maps the
function over them, and the job driver commits the results through the broker.

* :class:`SparkRunner` ships every unit to a Spark executor as its own task. The function
  is pickled by reference, so the executors' Python must import its module: with
  ``local[*]`` they run this machine's venv, where the package is installed; on a real
  cluster ship the package yourself, ``spark-submit --py-files automq_py.zip`` (a zip of
  ``automq_py``, ``protocol``, ``storage`` and ``spark_jobs``) or by installing the wheel
  on every worker. Spark retries a failed task on a cluster, so units must be idempotent
  (they are: they write PREPARED objects that only a commit makes visible).
* :class:`LocalRunner` runs the same units in threads of this process, for machines with
  no Java or pyspark.

``pyspark`` is imported only when a SparkRunner starts, so this module works without it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, TypeVar

from tqdm import tqdm

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger("automq.runner")

T = TypeVar("T")
R = TypeVar("R")

RUNNER_KINDS = ("auto", "spark", "local")
DEFAULT_MASTER = "local[*]"
# Spark 4 runs on Java 17 or newer.
MIN_JAVA = 17


class RunnerError(Exception):
    """A runner cannot be made or started (no Java, no pyspark, a bad master...)."""


class UnitFailedError(Exception):
    """A unit raised; ``index`` is its position in the units given to :meth:`Runner.map`."""

    def __init__(self, desc: str, index: int, error: str) -> None:
        super().__init__(f"{desc}: unit {index} failed: {error}")
        self.index = index


class Runner(Protocol):
    """Maps a unit function over units and yields the results as the units complete."""

    name: str
    """``spark`` or ``local``, for log lines."""

    def map(self, fn: Callable[[T], R], units: Sequence[T], *, desc: str = "units") -> Iterator[R]:
        """Run ``fn(unit)`` for every unit; yield each result as soon as its unit completes
        (completion order, not unit order: put what identifies a unit in its result).

        A progress bar named ``desc`` advances on stderr. The first failing unit raises
        :class:`UnitFailedError` and the units not yet finished are cancelled.
        """
        ...

    def close(self) -> None:
        """Release the workers (and stop the SparkContext this runner started)."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


async def run_units(
    runner: Runner, fn: Callable[[T], R], units: Sequence[T], *, desc: str = "units"
) -> list[R]:
    """All results of ``runner.map`` from async code: the blocking map runs in a thread,
    so the event loop (and the driver's broker connection) stays responsive."""
    return await asyncio.to_thread(lambda: list(runner.map(fn, units, desc=desc)))


def _progress(total: int, desc: str) -> tqdm:
    # Shown on logs too (not only on a terminal): a job that runs for minutes should say so.
    return tqdm(total=total, desc=desc, unit="unit", file=sys.stderr, mininterval=1.0)


class LocalRunner:
    """Runs units in this process: ``max_workers`` threads (units are I/O-bound).

    Units always run in worker threads, never on the caller's thread, so a unit may use
    ``asyncio.run`` even when the map is iterated from async code.
    """

    name = "local"

    def __init__(self, max_workers: int = 1) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, not {max_workers}")
        self.max_workers = max_workers

    def __repr__(self) -> str:
        return f"LocalRunner(max_workers={self.max_workers})"

    def map(self, fn: Callable[[T], R], units: Sequence[T], *, desc: str = "units") -> Iterator[R]:
        if not units:
            return
        with (
            _progress(len(units), desc) as bar,
            ThreadPoolExecutor(self.max_workers, thread_name_prefix="automq-unit") as pool,
        ):
            index = {pool.submit(fn, unit): i for i, unit in enumerate(units)}
            try:
                for future in as_completed(index):
                    error = future.exception()
                    if error is not None:
                        raise UnitFailedError(desc, index[future], repr(error)) from error
                    bar.update(1)
                    yield future.result()
            finally:
                for future in index:
                    future.cancel()

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SparkRunner:
    """Runs every unit as one Spark task; the SparkContext starts on the first map.

    ``master`` is a Spark master URL; ``None`` takes the one ``spark-submit`` was given
    (``local[*]`` outside spark-submit). A SparkContext that already exists in this process
    (spark-submit's, a notebook's) is reused and left running; one this runner started is
    stopped by :meth:`close`.

    Each unit is submitted as its own single-task job from a pool of driver threads (as many
    as the cluster has cores), so results come back as units finish, however uneven they
    are, and a failure cancels the other jobs of the map.
    """

    name = "spark"

    def __init__(
        self,
        master: str | None = DEFAULT_MASTER,
        app_name: str = "automq-py",
        *,
        driver_memory: str = "512m",
    ) -> None:
        self.master = master
        self.app_name = app_name
        self.driver_memory = driver_memory
        self._sc: SparkContext | None = None
        self._owns_context = False
        self._lock = threading.Lock()
        self.startup_seconds: float | None = None

    def __repr__(self) -> str:
        return f"SparkRunner(master={self.master!r}, app_name={self.app_name!r})"

    @property
    def context(self) -> SparkContext:
        """The SparkContext, started on first use."""
        with self._lock:
            if self._sc is None:
                self._sc = self._start()
            return self._sc

    def _start(self) -> SparkContext:
        ok, why = spark_available()
        if not ok:
            raise RunnerError(f"cannot start Spark: {why}")
        from pyspark import SparkConf, SparkContext

        # The JVM and the Python workers inherit this environment. Spark otherwise binds the
        # machine's public address and starts workers with the system python, which lacks
        # this package.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        # the JVM that builds the driver's command line (the driver's own options are below):
        # no hsperfdata directory left in /tmp
        os.environ.setdefault("SPARK_LAUNCHER_OPTS", "-XX:-UsePerfData")
        # py4j logs every closed gateway connection at INFO.
        logging.getLogger("py4j").setLevel(logging.WARNING)
        started = time.monotonic()
        created = SparkContext._active_spark_context is None
        # Driver memory counts only when this process launches the JVM; under spark-submit
        # the JVM exists and its properties (master, name, memory) are read back below.
        # Spark's scratch (block manager, fetched files, native libraries it unpacks) under the
        # temporary directory Python uses, so TMPDIR places it; Spark removes it at a clean
        # stop, and a killed job leaves it where TMPDIR said
        scratch = tempfile.gettempdir()
        launch = (
            SparkConf()
            .set("spark.driver.memory", self.driver_memory)
            # no hsperfdata directory left in /tmp (the JVM writes it there whatever the tmpdir)
            .set(
                "spark.driver.extraJavaOptions",
                f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData",
            )
        )
        SparkContext._ensure_initialized(conf=launch)
        conf = SparkConf()
        if self.master is not None:
            conf.setMaster(self.master)
        else:
            conf.setIfMissing("spark.master", DEFAULT_MASTER)
        if conf.get("spark.app.name") in (None, "pyspark-shell"):
            conf.setAppName(self.app_name)
        conf.setIfMissing("spark.ui.enabled", "false")
        conf.setIfMissing("spark.local.dir", scratch)
        # Spark's console stage bars (on by default for pyspark) would garble ours.
        conf.set("spark.ui.showConsoleProgress", "false")
        try:
            sc = SparkContext.getOrCreate(conf)
        except Exception as e:
            raise RunnerError(f"cannot start Spark (master {self.master}): {e}") from e
        sc.setLogLevel("WARN")
        self._owns_context = created
        self.startup_seconds = time.monotonic() - started
        log.info(
            "spark: %s context on %s (%d cores, Spark %s) in %.1f s",
            "started a" if created else "reusing the",
            sc.master,
            sc.defaultParallelism,
            sc.version,
            self.startup_seconds,
        )
        return sc

    def map(self, fn: Callable[[T], R], units: Sequence[T], *, desc: str = "units") -> Iterator[R]:
        if not units:
            return
        sc = self.context
        rdd = sc.parallelize(list(units), numSlices=len(units)).map(fn)
        tag = f"automq-{uuid.uuid4().hex[:12]}"
        threads = max(2, min(sc.defaultParallelism, len(units), 64))
        cancelled = threading.Event()

        def run_one(i: int) -> list[R]:
            if cancelled.is_set():
                raise RunnerError("cancelled")
            sc.addJobTag(tag)  # thread-local: marks this thread's jobs for cancellation
            try:
                sc.setJobDescription(f"{desc} {i + 1}/{len(units)}")
                return sc.runJob(rdd, _partition_results, partitions=[i])
            finally:
                sc.removeJobTag(tag)

        with (
            _progress(len(units), desc) as bar,
            ThreadPoolExecutor(threads, thread_name_prefix="automq-spark") as pool,
        ):
            pending: dict[Future[list[R]], int] = {
                pool.submit(run_one, i): i for i in range(len(units))
            }
            try:
                while pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        i = pending.pop(future)
                        error = future.exception()
                        if error is not None:
                            raise UnitFailedError(desc, i, _spark_error(error)) from error
                        bar.update(1)
                        yield from future.result()
            finally:
                if pending:
                    cancelled.set()
                    for future in pending:
                        future.cancel()
                    sc.cancelJobsWithTag(tag)

    def close(self) -> None:
        with self._lock:
            sc, self._sc = self._sc, None
        if sc is not None and self._owns_context:
            sc.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _partition_results(items: Iterable[R]) -> Iterable[R]:
    # runJob's partition function: the partition holds the one unit's result already.
    return items


def _spark_error(error: BaseException) -> str:
    """The Python traceback's last line from a failed Spark task, else the error itself."""
    text = str(error)
    tracebacks = re.findall(r"Traceback \(most recent call last\):\n(?:.*\n)*?(\S.*)\n", text)
    if tracebacks:
        return str(tracebacks[-1])
    return text.strip().splitlines()[0] if text.strip() else repr(error)


def java_executable() -> str | None:
    """``$JAVA_HOME/bin/java`` when it exists, else ``java`` on PATH, else None."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def java_major_version(java: str) -> int | None:
    """The major version ``java -version`` reports (8 for ``1.8.0``), None when it fails."""
    try:
        done = subprocess.run(
            # -XX:-UsePerfData: no hsperfdata directory left in /tmp
            [java, "-XX:-UsePerfData", "-version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def spark_available() -> tuple[bool, str]:
    """Whether a SparkRunner can start here: pyspark importable and Java 17+ found.

    The string says what was found, or why not.
    """
    if importlib.util.find_spec("pyspark") is None:
        return False, "pyspark is not installed (pip install 'automq-py[spark]')"
    java = java_executable()
    if java is None:
        return False, "no Java runtime (set JAVA_HOME or put java on PATH; Spark needs 17+)"
    major = java_major_version(java)
    if major is None:
        return False, f"{java} -version failed"
    if major < MIN_JAVA:
        return False, f"{java} is Java {major}; Spark 4 needs Java {MIN_JAVA} or newer"
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = f"pyspark {version('pyspark')}"
    except PackageNotFoundError:  # importable from a path (SPARK_HOME's), not installed
        found = "pyspark (not installed as a package)"
    return True, f"{found} and Java {major} ({java})"


def make_runner(
    kind: str, master: str | None = None, *, local_workers: int | None = None
) -> Runner:
    """The runner for ``--runner kind`` (``auto``, ``spark`` or ``local``) and ``--master``.

    ``auto`` means Spark when :func:`spark_available`, else in-process; a master implies
    Spark. ``master=None`` on Spark takes spark-submit's master, else ``local[*]``.
    ``local_workers`` is the LocalRunner's thread count (default: the CPU count).
    Raises RunnerError when Spark is asked for and cannot run here.
    """
    if kind not in RUNNER_KINDS:
        raise ValueError(f"runner must be one of {', '.join(RUNNER_KINDS)}, not {kind!r}")
    if kind == "local" and master is not None:
        raise RunnerError("--master needs the spark runner, not --runner local")
    workers = local_workers or os.cpu_count() or 1
    if kind == "local":
        log.info("runner: local (%d threads in this process), as asked", workers)
        return LocalRunner(workers)
    ok, why = spark_available()
    if ok:
        shown = master or f"{DEFAULT_MASTER} unless spark-submit gives one"
        log.info("runner: spark, master %s: %s", shown, why)
        return SparkRunner(master)
    if kind == "spark" or master is not None:
        raise RunnerError(f"the spark runner cannot run here: {why}")
    log.info("runner: local (%d threads in this process): spark unavailable, %s", workers, why)
    return LocalRunner(workers)
