"""The broker's own log output: ``log.format`` (``text`` lines, or ``json``: one object per
line, for a log pipeline), the root level ``log.level`` and a level per logger from the
``log.level.<logger>`` properties (``log.level.automq.network=DEBUG``, or with ``serve --env``
``KAFKA_LOG_LEVEL_AUTOMQ_NETWORK=DEBUG``).

A JSON line carries ``timestamp`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``,
``message``, ``thread``, the broker's ``node_id`` and ``cluster_id``, and ``exception`` (the
formatted traceback) when there is one.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping

LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOGGER_LEVEL_PREFIX = "log.level."


class JsonFormatter(logging.Formatter):
    def __init__(self, static: Mapping[str, object] | None = None) -> None:
        super().__init__()
        self._static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, object] = {
            "timestamp": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
            **self._static,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False, default=str)


def logger_levels(props: Mapping[str, str]) -> dict[str, str]:
    """The ``log.level.<logger>`` properties, as logger -> level; raises ValueError naming the
    property when a level is not one of :data:`LEVELS`."""
    out = {}
    for name, value in props.items():
        if not name.startswith(LOGGER_LEVEL_PREFIX):
            continue
        logger = name[len(LOGGER_LEVEL_PREFIX) :]
        level = value.strip().upper()
        if not logger or level not in LEVELS:
            raise ValueError(f"{name}: expected a logger name and one of {', '.join(LEVELS)}")
        out[logger] = level
    return out


def configure(
    log_format: str,
    root_level: str,
    levels: Mapping[str, str],
    static: Mapping[str, object] | None = None,
) -> None:
    """Send every record to stderr in ``log_format`` at ``root_level``, with ``levels`` per
    logger (replacing the handlers the command line set up before the configuration was read)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(static))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(root_level)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
