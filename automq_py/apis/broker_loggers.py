"""The BROKER_LOGGER config resource (KIP-412): the broker's loggers and their levels, described
with DescribeConfigs and changed with IncrementalAlterConfigs while the broker runs, as Kafka 3.9
does it for log4j (``Log4jController``, ``RuntimeLoggerManager``, ``ConfigAdminManager``), on
Python's ``logging``.

The loggers are the root logger, named ``root``, and every ``logging.Logger`` the process has
created (``automq.broker``, ``automq.network``, ``storage.wal.object_wal``, libraries' loggers;
not the placeholders ``logging`` keeps for the dotted names between them). A logger with no
level of its own is described with the level it inherits. Levels are named in log4j's words:

=========  ============================================================
log4j      Python
=========  ============================================================
``OFF``    above ``CRITICAL`` (described; Kafka 3.9 does not set it)
``FATAL``  ``CRITICAL``
``ERROR``  ``ERROR``
``WARN``   ``WARNING``
``INFO``   ``INFO``
``DEBUG``  ``DEBUG``
``TRACE``  5, below ``DEBUG``
``ALL``    below ``TRACE`` (described; not set)
=========  ============================================================

A level in between is described as the next level up: the least severe of the named levels it
still lets through. SET gives a logger one of Kafka's levels (case matters, as in Kafka);
DELETE takes its own level away, so it inherits again (the root logger's must stay). A change
acts at once and lasts until the broker restarts: Kafka does not store it either, and the
``log.level`` properties apply again at the next start.

Every refusal is the error code and message a Kafka 3.9.0 broker answers; legacy AlterConfigs
(ApiKey 33) refuses the resource type, as Kafka's does.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from protocol.errors import ErrorCode

log = logging.getLogger("automq.apis")

ROOT_LOGGER = "root"
TRACE = 5  # below DEBUG, as log4j's TRACE

# Kafka 3.9's LogLevelConfig.VALID_LOG_LEVELS (OFF is not one of them) -> the Python level set
SETTABLE_LEVELS = {
    "FATAL": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": TRACE,
}
_VALID_LEVELS_TEXT = ", ".join(sorted(SETTABLE_LEVELS))

# the highest Python level each log4j name stands for, least severe first
_LOG4J_CEILINGS = (
    (TRACE - 1, "ALL"),
    (TRACE, "TRACE"),
    (logging.DEBUG, "DEBUG"),
    (logging.INFO, "INFO"),
    (logging.WARNING, "WARN"),
    (logging.ERROR, "ERROR"),
    (logging.CRITICAL, "FATAL"),
)

# DescribeConfigs' config_source of a broker logger
DYNAMIC_BROKER_LOGGER_CONFIG = 6


# IncrementalAlterConfigs' config_operation (configs.OpType's values; this module does not
# import the handlers that import it)
class OpType(IntEnum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class BrokerLoggerError(Exception):
    """A BROKER_LOGGER resource refused: the Kafka error code and message (None where Kafka
    sends none, as for UNKNOWN_SERVER_ERROR)."""

    def __init__(self, code: ErrorCode, message: str | None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def log4j_level(level: int) -> str:
    """A Python level in log4j's words."""
    for ceiling, name in _LOG4J_CEILINGS:
        if level <= ceiling:
            return name
    return "OFF"


def existing_logger(name: str, manager: logging.Manager | None = None) -> logging.Logger | None:
    """The logger called ``name`` if the process has created it (``root``: the root logger)."""
    manager = manager or logging.Logger.manager
    if name == ROOT_LOGGER:
        return manager.root
    found = manager.loggerDict.get(name)
    return found if isinstance(found, logging.Logger) else None


def logger_exists(name: str) -> bool:
    return existing_logger(name) is not None


def logger_levels(manager: logging.Manager | None = None) -> dict[str, str]:
    """Every logger -> its effective level in log4j's words: ``root`` first, then by name."""
    manager = manager or logging.Logger.manager
    levels = {ROOT_LOGGER: log4j_level(manager.root.getEffectiveLevel())}
    # a copy: other threads may create loggers meanwhile
    found = list(manager.loggerDict.items())
    for name, logger in sorted(found, key=lambda item: item[0]):
        if isinstance(logger, logging.Logger):
            levels[name] = log4j_level(logger.getEffectiveLevel())
    return levels


# -- DescribeConfigs ---------------------------------------------------------------------------


def describe(
    node_id: int, name: str, manager: logging.Manager | None = None
) -> list[dict[str, Any]]:
    """The DescribeConfigs entries of broker logger resource ``name`` (this broker's id): one
    per logger, as Kafka's ConfigHelper answers them (no type, synonyms or documentation)."""
    if not name:
        raise BrokerLoggerError(ErrorCode.INVALID_REQUEST, "Broker id must not be empty")
    if _java_int(name, "Broker id") != node_id:
        raise BrokerLoggerError(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {node_id} but received {name}",
        )
    return [
        {
            "name": logger,
            "value": level,
            "read_only": False,
            "config_source": DYNAMIC_BROKER_LOGGER_CONFIG,
            "is_sensitive": False,
            "synonyms": [],
            "config_type": 0,  # UNKNOWN
            "documentation": "",
        }
        for logger, level in logger_levels(manager).items()
    ]


# -- IncrementalAlterConfigs, AlterConfigs -----------------------------------------------------


@dataclass(slots=True, frozen=True)
class LevelChange:
    """One logger's new level (log4j's name), or None: inherit its parent's."""

    logger: str
    level: str | None


def plan_alter(
    node_id: int,
    name: str,
    ops: Sequence[tuple[str, int, str | None]],
    authorized: bool,
    exists: Callable[[str], bool],
) -> list[LevelChange]:
    """The changes IncrementalAlterConfigs ``ops`` (name, operation, value) ask of broker logger
    resource ``name``, checked in Kafka 3.9's order (ConfigAdminManager.preprocess, then
    RuntimeLoggerManager); the first refusal raises BrokerLoggerError and nothing changes."""
    _check_config_names(ops, lambda op, value: op != OpType.DELETE and value is None)
    if not authorized:
        raise BrokerLoggerError(
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."
        )
    if _java_int(name, "Node id") != node_id:
        # Kafka 3.9 prints its own id in both places here; the id received is more use
        raise BrokerLoggerError(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected node id. Expected {node_id}, but received {name}",
        )
    changes = []
    for logger, op, value in ops:
        if op == OpType.SET:
            _check_exists(logger, exists)
            if value not in SETTABLE_LEVELS:
                raise BrokerLoggerError(
                    ErrorCode.INVALID_CONFIG,
                    f"Cannot set the log level of {logger} to {value} as it is not a supported "
                    f"log level. Valid log levels are {_VALID_LEVELS_TEXT}",
                )
            changes.append(LevelChange(logger, value))
        elif op == OpType.DELETE:
            _check_exists(logger, exists)
            if logger == ROOT_LOGGER:
                raise BrokerLoggerError(
                    ErrorCode.INVALID_REQUEST,
                    f"Removing the log level of the {ROOT_LOGGER} logger is not allowed",
                )
            changes.append(LevelChange(logger, None))
        elif op in (OpType.APPEND, OpType.SUBTRACT):
            raise BrokerLoggerError(
                ErrorCode.INVALID_REQUEST,
                f"{OpType(op).name} operation is not allowed for the BROKER_LOGGER resource",
            )
        else:
            # Kafka fails on an operation id it has no name for, and says no more
            raise BrokerLoggerError(ErrorCode.UNKNOWN_SERVER_ERROR, None)
    return changes


def refuse_legacy_alter(configs: Sequence[tuple[str, str | None]]) -> BrokerLoggerError:
    """Kafka 3.9's answer to legacy AlterConfigs of a broker logger resource: it checks the
    names and values as for any resource, then refuses the type."""
    try:
        _check_config_names([(n, -1, v) for n, v in configs], lambda _, value: value is None)
    except BrokerLoggerError as e:
        return e
    return BrokerLoggerError(ErrorCode.INVALID_REQUEST, "Unknown resource type 8")


def apply(changes: Sequence[LevelChange], manager: logging.Manager | None = None) -> None:
    """Set each logger's level now, logging each change as Kafka does (at WARN)."""
    for change in changes:
        logger = existing_logger(change.logger, manager)
        if logger is None:  # checked by plan_alter; a logger is never removed
            continue
        if change.level is None:
            logger.setLevel(logging.NOTSET)
            log.warning("Unset the log level of %s", change.logger)
        else:
            logger.setLevel(SETTABLE_LEVELS[change.level])
            log.warning("Updated the log level of %s to %s", change.logger, change.level)


def _check_config_names(
    ops: Sequence[tuple[str, int, str | None]], refused_null: Callable[[int, str | None], bool]
) -> None:
    if any(count > 1 for count in Counter(name for name, _, _ in ops).values()):
        raise BrokerLoggerError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    nulls = [name for name, op, value in ops if refused_null(op, value)]
    if nulls:
        raise BrokerLoggerError(
            ErrorCode.INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls)
        )


def _check_exists(logger: str, exists: Callable[[str], bool]) -> None:
    if not exists(logger):
        raise BrokerLoggerError(ErrorCode.INVALID_CONFIG, f"Logger {logger} does not exist!")


_JAVA_INT = re.compile(r"[+-]?[0-9]+")


def _java_int(text: str, what: str) -> int:
    """``text`` read as Java's Integer.parseInt reads it (no spaces, no underscores, 32 bits),
    else Kafka's INVALID_REQUEST naming ``what``."""
    if _JAVA_INT.fullmatch(text) and -(1 << 31) <= int(text) < 1 << 31:
        return int(text)
    raise BrokerLoggerError(
        ErrorCode.INVALID_REQUEST, f"{what} must be an integer, but it is: {text}"
    )
