"""The broker's own maintenance: compaction, retention and object GC on AutoMQ's intervals.

A broker nobody tends must stay bounded, so it runs the same jobs as ``automq-py compact|
retention|gc`` by itself:

===============================  =====================================================
job                              every
===============================  =====================================================
SSO compaction                   ``s3.stream.set.object.compaction.interval.minutes``
SO compaction                    ``s3.stream.object.compaction.interval.minutes``
key compaction                   ``log.cleaner.backoff.ms`` (only when a compacted
                                 topic's partition is dirty enough: checked in-process;
                                 the interval may change at run time, a dynamic config)
retention, then GC               ``log.retention.check.interval.ms``
===============================  =====================================================

``s3.maintenance.runner`` picks who compacts: ``spark`` runs each compaction as a child process
(``automq-py compact --runner spark``: Spark's JVM and the job's memory stay out of the broker),
``local`` runs its units on worker threads of this process with their own event loop, ``auto``
takes ``spark`` when pyspark and a JVM are there, else ``local``; ``none`` disables
maintenance. Retention and GC always run in-process: they list, delete and ask the broker to
trim, work that a JVM per five-minute check would cost far more CPU than it does. Either way
the job talks to this broker over its own listener, like any client, so produce and fetch are
served meanwhile. A failed run is logged and retried next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from automq_py.config import BrokerConfig
from storage import child_process

log = logging.getLogger("automq.maintenance")

MINUTE_S = 60.0
JOB_TIMEOUT_S = 3600.0
LOCAL_WORKERS = 4  # threads for the units of an in-process job (they wait on I/O)
# the jobs over every node's objects: in a cluster, only the controller runs them
CLUSTER_WIDE_STEPS = frozenset({"compact-sso", "compact-so", "gc"})


class Maintenance:
    """Schedules the jobs against the broker listening at ``bootstrap``."""

    def __init__(
        self,
        config: BrokerConfig,
        bootstrap: str,
        cluster_wide: Callable[[], bool] | None = None,
        cleaner_backoff_ms: Callable[[], int] | None = None,
    ) -> None:
        """``cleaner_backoff_ms``: ``log.cleaner.backoff.ms`` in effect now (a dynamic
        config), read before each wait; else the configured value."""
        self.config = config
        self._cleaner_backoff_ms = cleaner_backoff_ms or (lambda: config.log_cleaner_backoff_ms)
        self.bootstrap = bootstrap
        # in a cluster: whether this broker runs the jobs over every node's objects now (it is
        # the controller), so two brokers never compact or collect the same objects; retention
        # and key compaction tend the partitions each broker leads, on every broker
        self._cluster_wide = cluster_wide
        self.runner = config.storage.maintenance_runner  # "auto" is resolved by start()
        # per step: runs done and failed, seconds spent, and the jobs' counters summed
        self.runs: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.counters: dict[str, dict[str, int]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()  # one job at a time: they share the bucket and controller
        self._properties_file: str | None = None

    def start(self) -> None:
        """Schedule the jobs (after resolving ``auto``, off the event loop: it runs
        ``java -version``)."""
        self._tasks.append(asyncio.create_task(self._schedule(), name="maintenance"))

    async def _schedule(self) -> None:
        storage = self.config.storage
        if self.runner == "auto":
            try:
                self.runner = await asyncio.to_thread(_resolve_runner, self.runner)
            except Exception as e:
                log.warning("maintenance: no Spark (%s), jobs run in-process", e)
                self.runner = "local"
        if self.runner == "none":
            log.warning(
                "maintenance is off (s3.maintenance.runner=none): objects are never "
                "compacted, trimmed or deleted"
            )
            return
        sso_s = storage.sso_compaction_interval_minutes * MINUTE_S
        so_s = storage.so_compaction_interval_minutes * MINUTE_S
        retention_s = self.config.log_retention_check_interval_ms / 1000
        schedule: dict[str, Callable[[], float]] = {
            "compact-sso": lambda: sso_s,
            "compact-so": lambda: so_s,
            "compact-key": lambda: self._cleaner_backoff_ms() / 1000,
            "retention": lambda: retention_s,
        }
        log.info(
            "maintenance: compaction on %s; SSO compaction every %.0fs, SO compaction every "
            "%.0fs, key compaction checked every %.0fs, retention and GC (in-process) every "
            "%.0fs",
            self.runner,
            *(interval() for interval in schedule.values()),
        )
        for job, interval in schedule.items():
            self._tasks.append(asyncio.create_task(self._every(job, interval), name=job))

    async def stop(self) -> None:
        while self._tasks:  # the scheduling task may be adding the job tasks meanwhile
            tasks, self._tasks = self._tasks, []
            for task in tasks:
                task.cancel()
            for task in tasks:
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:  # a stop must go on to the broker's other parts
                    log.exception("maintenance task %s had failed", task.get_name())
        if self._properties_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._properties_file)
            self._properties_file = None

    async def _every(self, job: str, interval_s: Callable[[], float]) -> None:
        while True:
            await asyncio.sleep(interval_s())
            await self.run(job)

    async def run(self, job: str) -> None:
        """Run ``job`` now (``compact-sso``, ``compact-so``, ``retention`` also runs GC)."""
        async with self._lock:
            steps = ["retention", "gc"] if job == "retention" else [job]
            for step in steps:
                if step in CLUSTER_WIDE_STEPS and not self._runs_cluster_wide():
                    continue
                started = time.monotonic()
                if step == "compact-key":
                    try:
                        due = await asyncio.to_thread(self._key_compaction_due)
                    except Exception as e:
                        log.warning("maintenance %s: cannot check (retried): %s", step, e)
                        continue
                    if not due:
                        continue  # nothing dirty enough: no job started, no log line
                try:
                    if self.runner == "spark" and step.startswith("compact"):
                        await self._run_child(step)
                    else:
                        await asyncio.to_thread(self._run_local, step)
                except Exception as e:
                    self.failures[step] = self.failures.get(step, 0) + 1
                    log.warning("maintenance %s failed (retried next interval): %s", step, e)
                    continue
                took = time.monotonic() - started
                self.runs[step] = self.runs.get(step, 0) + 1
                self.seconds[step] = self.seconds.get(step, 0.0) + took
                log.info("maintenance %s done in %.1fs", step, took)

    def _runs_cluster_wide(self) -> bool:
        return self._cluster_wide is None or self._cluster_wide()

    def _key_compaction_due(self) -> bool:
        """Whether a compacted topic's partition is due for cleaning (a DescribeLogSegments of
        the ``compact`` topics only, so other partitions stay shut, and the planner: cheap,
        unlike starting a job)."""
        from spark_jobs.controller_client import ControllerClient
        from storage.compaction.cleanable import plan_cleaning

        async def check() -> bool:
            async with await ControllerClient.connect(self.bootstrap) as client:
                logs, now = await client.describe_log_segments(cleanup_policy="compact")
            return any(plan_cleaning(p, now) is not None for p in logs)

        return asyncio.run(check())

    def _run_local(self, step: str) -> None:
        """The job's driver on this worker thread, with its own event loop; units on threads."""
        from spark_jobs import jobs
        from spark_jobs.runner import LocalRunner

        out = io.StringIO()
        storage = self.config.storage
        with LocalRunner(LOCAL_WORKERS) as runner:
            drivers: dict[str, Callable[[], Awaitable[dict[str, int]]]] = {
                "compact-sso": lambda: jobs.run_compaction(
                    storage, self.bootstrap, runner, kind="sso", dry_run=False, out=out
                ),
                "compact-so": lambda: jobs.run_compaction(
                    storage, self.bootstrap, runner, kind="so", dry_run=False, out=out
                ),
                "compact-key": lambda: jobs.run_compaction(
                    storage, self.bootstrap, runner, kind="key", dry_run=False, out=out
                ),
                "retention": lambda: jobs.run_retention(
                    storage, self.bootstrap, runner, dry_run=False, out=out
                ),
                "gc": lambda: jobs.run_gc(storage, self.bootstrap, runner, dry_run=False, out=out),
            }
            counters: dict[str, int] = asyncio.run(drivers[step]())  # type: ignore[arg-type]
        totals = self.counters.setdefault(step, {})
        for name, n in counters.items():
            totals[name] = totals.get(name, 0) + n
        for line in out.getvalue().splitlines():
            log.debug("%s: %s", step, line)
        log.info("maintenance %s: %s", step, _summary(counters))

    async def _run_child(self, step: str) -> None:
        """``automq-py <job> --runner spark`` with this broker's properties."""
        command = {
            "compact-sso": ["compact", "--kind", "sso"],
            "compact-so": ["compact", "--kind", "so"],
            "compact-key": ["compact", "--kind", "key"],
        }.get(step, [step])
        args = [
            sys.executable,
            "-m",
            "automq_py",
            *command,
            "-c",
            self._properties(),
            "--bootstrap-server",
            self.bootstrap,
            "--runner",
            "spark",
        ]
        # (not asyncio's: under uvloop it forks the broker, see storage.child_process)
        child = await child_process.spawn(
            args,
            stdin=child_process.DEVNULL,
            stdout=child_process.PIPE,
            stderr=child_process.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(child.communicate(), JOB_TIMEOUT_S)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
            raise
        lines = output.decode(errors="replace").splitlines()
        if child.returncode != 0:
            raise RuntimeError(f"exit code {child.returncode}: " + " | ".join(lines[-5:]))
        log.info("maintenance %s: %s", step, lines[-1] if lines else "")

    def _properties(self) -> str:
        """The broker's given properties in a file only this user can read (it may hold the
        S3 secret), for the child jobs' ``-c``."""
        if self._properties_file is None:
            fd, path = tempfile.mkstemp(prefix="automq-maintenance-", suffix=".properties")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for key, value in self.config.properties.items():
                    f.write(f"{_escape(key)}={_escape(value)}\n")
            self._properties_file = path
        return self._properties_file


def _escape(text: str) -> str:
    """Java properties escaping of the characters our parser treats specially."""
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")
    return out.replace("#", "\\#").replace("!", "\\!")


def _resolve_runner(kind: str) -> str:
    if kind in ("local", "none", "spark"):
        return kind
    from spark_jobs.runner import spark_available

    ok, why = spark_available()
    log.info("maintenance: %s", f"Spark available ({why})" if ok else f"no Spark ({why})")
    return "spark" if ok else "local"


def _summary(counters: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(counters.items())) or "nothing to do"
