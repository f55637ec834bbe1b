"""The job drivers behind ``automq-py compact|retention|gc``.

Each driver reads metadata from the broker's controller at ``bootstrap`` (over the Kafka
protocol, with AutoMQ's extension APIs), plans units with the pure planners in
``storage/``, maps them over ``runner`` and commits the results through the broker. It
prints its plan to ``out`` and, with ``dry_run``, stops there. It returns counters
(``{"objects_compacted": 3, ...}``) that the command prints as its summary line.

Stubs for now: the signatures are the contract with ``automq_py/cli/jobs.py``.
"""

from __future__ import annotations

from typing import TextIO

from spark_jobs.runner import Runner
from storage.config import S3StreamConfig

COMPACTION_KINDS = ("sso", "so", "all")


async def run_compaction(
    storage_config: S3StreamConfig,
    bootstrap: str,
    runner: Runner,
    *,
    kind: str,
    dry_run: bool,
    out: TextIO,
) -> dict[str, int]:
    """Compact stream set objects (``sso``), stream objects (``so``) or both (``all``)."""
    print("compaction: not implemented yet", file=out)
    return {}


async def run_retention(
    storage_config: S3StreamConfig,
    bootstrap: str,
    runner: Runner,
    *,
    dry_run: bool,
    out: TextIO,
) -> dict[str, int]:
    """Apply ``retention.ms`` / ``retention.bytes``: trim streams, mark objects destroyed."""
    print("retention: not implemented yet", file=out)
    return {}


async def run_gc(
    storage_config: S3StreamConfig,
    bootstrap: str,
    runner: Runner,
    *,
    dry_run: bool,
    out: TextIO,
) -> dict[str, int]:
    """Delete expired PREPARED objects, destroyed objects past their delay, and orphans."""
    print("gc: not implemented yet", file=out)
    return {}
