"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44).

A topic's configs are the :class:`LogConfig` properties: the topic's own values (stored with
the topic; source DYNAMIC_TOPIC_CONFIG) over the broker's ``log.*`` defaults
(STATIC_BROKER_CONFIG when the broker's properties set them, else DEFAULT_CONFIG).

A change is validated by LogConfig, stored by :meth:`TopicRegistry.update` and handed to the
partitions already open, so ``max.message.bytes``, ``segment.bytes`` and ``segment.ms`` act on
the next append; what a segment fixes when it is created (``index.interval.bytes``,
``segment.index.bytes``) acts from the next segment on.

The broker resource lists every broker property, read-only: automq-py reads its configuration
once at start and keeps no dynamic broker configs, so altering one is refused as Kafka refuses
a static config (INVALID_REQUEST).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import fields
from enum import IntEnum
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.config import BrokerConfig
from automq_py.log.log_config import LogConfig, LogConfigError
from automq_py.topics import TopicInfo
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema
from storage.config import S3StreamConfig


class ResourceType(IntEnum):
    TOPIC = 2
    BROKER = 4


class ConfigSource(IntEnum):
    DYNAMIC_TOPIC_CONFIG = 1
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class ConfigType(IntEnum):
    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    LIST = 7


class OpType(IntEnum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


# Kafka's ServerTopicConfigSynonyms for the topic properties this broker has a default for
# (the keys of BrokerConfig.topic_defaults), highest precedence first.
BROKER_SYNONYMS: dict[str, tuple[str, ...]] = {
    "segment.bytes": ("log.segment.bytes",),
    "segment.ms": ("log.roll.ms", "log.roll.hours"),
    "retention.ms": ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    "retention.bytes": ("log.retention.bytes",),
    "index.interval.bytes": ("log.index.interval.bytes",),
    "max.message.bytes": ("message.max.bytes",),
    "message.timestamp.type": ("log.message.timestamp.type",),
    "cleanup.policy": ("log.cleanup.policy",),
}
# Topic properties Kafka types as INT; the other integers are LONG.
_INT_TOPIC_PROPERTIES = frozenset(
    ("segment.bytes", "segment.index.bytes", "index.interval.bytes", "max.message.bytes")
)
_BROKER_KINDS = {
    "int": ConfigType.INT,
    "long": ConfigType.LONG,
    "bool": ConfigType.BOOLEAN,
    "list": ConfigType.LIST,
}


class ConfigRequestError(Exception):
    """A resource of the request refused; ``code`` is the Kafka error code to answer with."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- DescribeConfigs ---------------------------------------------------------------------------


async def handle_describe_configs(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    synonyms = bool(getattr(body, "include_synonyms", False))
    documentation = bool(getattr(body, "include_documentation", False))
    results = []
    for r in body.resources:
        kind, name = int(r.resource_type), str(r.resource_name)
        # null or empty: every config
        keys = {str(k) for k in r.configuration_keys} if r.configuration_keys else None
        entry: dict[str, Any] = {
            "resource_type": kind,
            "resource_name": name,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "configs": [],
        }
        try:
            if kind == ResourceType.TOPIC:
                configs = describe_topic(ctx, _topic(ctx, name), synonyms, documentation)
            elif kind == ResourceType.BROKER:
                configs = describe_broker(ctx, name, synonyms, documentation)
            else:
                raise ConfigRequestError(
                    ErrorCode.INVALID_REQUEST, f"unsupported resource type {kind}"
                )
            entry["configs"] = [c for c in configs if keys is None or c["name"] in keys]
        except ConfigRequestError as e:
            entry.update(error_code=e.code, error_message=str(e))
        results.append(entry)
    return build.build(
        response_schema(ApiKey.DESCRIBE_CONFIGS, request.api_version),
        {"throttle_time": 0, "results": results},
    )


def describe_topic(
    ctx: BrokerContext, topic: TopicInfo, synonyms: bool, documentation: bool
) -> list[dict[str, Any]]:
    """Every LogConfig property of ``topic`` with its effective value and where it comes from."""
    inherited = ctx.replicas.topic_defaults
    effective = LogConfig.from_properties({**inherited, **topic.configs})
    given = ctx.config.properties
    defaults = _broker_defaults()
    out = []
    for name, (attr, default, doc) in LogConfig.properties().items():
        # a broker property this broker does not read is no synonym, whatever Kafka says
        broker_names = BROKER_SYNONYMS.get(name, ()) if name in inherited else ()
        chain: list[tuple[str, str, ConfigSource]] = []
        if name in topic.configs:
            chain.append((name, topic.configs[name], ConfigSource.DYNAMIC_TOPIC_CONFIG))
        chain += [
            (b, given[b], ConfigSource.STATIC_BROKER_CONFIG) for b in broker_names if b in given
        ]
        # Kafka names the default after the broker property it is written as (log.retention.hours)
        default_name = next((b for b in reversed(broker_names) if b in defaults), None)
        if default_name is None:
            chain.append((name, _format(default), ConfigSource.DEFAULT_CONFIG))
        else:
            chain.append((default_name, defaults[default_name], ConfigSource.DEFAULT_CONFIG))
        if isinstance(default, tuple):
            config_type = ConfigType.LIST
        elif isinstance(default, int):
            config_type = ConfigType.INT if name in _INT_TOPIC_PROPERTIES else ConfigType.LONG
        else:
            config_type = ConfigType.STRING
        out.append(
            {
                "name": name,
                "value": _format(getattr(effective, attr)),
                "read_only": False,
                "config_source": chain[0][2],
                "is_sensitive": False,
                "synonyms": _synonyms(chain) if synonyms else [],
                "config_type": config_type,
                "documentation": doc if documentation else None,
            }
        )
    return out


def describe_broker(
    ctx: BrokerContext, name: str, synonyms: bool, documentation: bool
) -> list[dict[str, Any]]:
    """Every broker property with its effective value, secrets redacted; all read-only."""
    if name == "":
        return []  # the cluster-wide dynamic defaults: this broker keeps none
    _check_broker(ctx, name)
    config = ctx.config
    shown = config.all_properties()
    plain = config.all_properties(redact=False)
    defaults = _broker_defaults()
    meta = _broker_metadata()
    out = []
    for prop, value in shown.items():
        chain: list[tuple[str, str, ConfigSource]] = []
        if prop in config.properties:
            chain.append((prop, value, ConfigSource.STATIC_BROKER_CONFIG))
        if prop in defaults:
            chain.append((prop, defaults[prop], ConfigSource.DEFAULT_CONFIG))
        source = chain[0][2] if chain else ConfigSource.DEFAULT_CONFIG
        config_type, doc = meta.get(prop, (ConfigType.STRING, None))
        out.append(
            {
                "name": prop,
                "value": value,
                "read_only": True,
                "config_source": source,
                # the redacted form is still shown: the rest of a url (endpoint, bucket) helps
                "is_sensitive": value != plain.get(prop),
                "synonyms": _synonyms(chain) if synonyms else [],
                "config_type": config_type,
                "documentation": doc if documentation else None,
            }
        )
    return out


def _synonyms(chain: list[tuple[str, str, ConfigSource]]) -> list[dict[str, Any]]:
    return [{"name": n, "value": v, "source": s} for n, v, s in chain]


@functools.cache
def _broker_defaults() -> Mapping[str, str]:
    """Every broker property's value when nothing is configured."""
    return BrokerConfig.from_properties({}).all_properties()


@functools.cache
def _broker_metadata() -> Mapping[str, tuple[ConfigType, str | None]]:
    """Broker property -> (type, documentation), for those declared with a description."""
    out: dict[str, tuple[ConfigType, str | None]] = {}
    for f in fields(BrokerConfig):
        if "property" in f.metadata:
            kind = _BROKER_KINDS.get(f.metadata["kind"], ConfigType.STRING)
            out[f.metadata["property"]] = (kind, f.metadata["doc"])
    for prop, (_, default, doc) in S3StreamConfig.properties().items():
        if isinstance(default, bool):
            out[prop] = (ConfigType.BOOLEAN, doc)
        elif isinstance(default, int):
            out[prop] = (ConfigType.LONG, doc)
        else:
            out[prop] = (ConfigType.STRING, doc)
    return out


def _format(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


# -- AlterConfigs, IncrementalAlterConfigs ---------------------------------------------------


async def handle_alter_configs(ctx: BrokerContext, request: Request) -> Any:
    """Replace the whole set of a topic's configs (a config left out returns to its default)."""

    def replace_all(topic: TopicInfo, entries: Any) -> dict[str, str]:
        # a null value sets nothing, as in Kafka
        return {str(c.name): str(c.value) for c in entries if c.value is not None}

    return await _alter(ctx, request, 33, replace_all)


async def handle_incremental_alter_configs(ctx: BrokerContext, request: Request) -> Any:
    """SET, DELETE, APPEND to or SUBTRACT from a topic's configs; the rest stay as they are."""
    return await _alter(
        ctx, request, 44, lambda topic, entries: incremental_configs(ctx, topic, entries)
    )


async def _alter(
    ctx: BrokerContext,
    request: Request,
    api_key: int,
    new_configs: Callable[[TopicInfo, Any], dict[str, str]],
) -> Any:
    """The shared walk of both alter APIs: per resource, check the names, compute the topic's
    new configs with ``new_configs`` and apply them (broker resources are refused)."""
    body = request.body
    responses = []
    for r in body.resources:
        kind, name = int(r.resource_type), str(r.resource_name)
        entry = _alter_entry(kind, name)
        try:
            names = [str(c.name) for c in r.configs]
            _check_unique(names)
            if kind == ResourceType.TOPIC:
                topic = _topic(ctx, name)
                configs = new_configs(topic, r.configs)
                await apply_topic_configs(ctx, topic, configs, bool(body.validate_only))
            else:
                _refuse_alter(ctx, kind, name, names)
        except ConfigRequestError as e:
            entry.update(error_code=e.code, error_message=str(e))
        responses.append(entry)
    return build.build(
        response_schema(api_key, request.api_version), {"throttle_time": 0, "responses": responses}
    )


def incremental_configs(ctx: BrokerContext, topic: TopicInfo, ops: Any) -> dict[str, str]:
    """The topic's configs after ``ops`` (each with name, config_operation, value)."""
    configs = dict(topic.configs)
    properties = LogConfig.properties()
    for op in ops:
        name, value, kind = str(op.name), op.value, int(op.config_operation)
        if kind == OpType.DELETE:
            configs.pop(name, None)
            continue
        if kind not in (OpType.SET, OpType.APPEND, OpType.SUBTRACT):
            raise ConfigRequestError(
                ErrorCode.INVALID_REQUEST, f"{name}: unknown config operation {kind}"
            )
        if value is None:
            raise ConfigRequestError(ErrorCode.INVALID_REQUEST, f"{name}: a null value")
        if kind == OpType.SET:
            configs[name] = str(value)
            continue
        found = properties.get(name)
        if found is None or not isinstance(found[1], tuple):
            verb = "append" if kind == OpType.APPEND else "subtract"
            raise ConfigRequestError(
                ErrorCode.INVALID_CONFIG, f"{name}: {verb} applies to list configs only"
            )
        # the list the topic has now: its own value, else what it inherits
        current = configs.get(name) or ctx.replicas.topic_defaults.get(name) or _format(found[1])
        items = [v.strip() for v in current.split(",") if v.strip()]
        given = [v.strip() for v in str(value).split(",") if v.strip()]
        if kind == OpType.APPEND:
            items += [v for v in given if v not in items]
        else:
            items = [v for v in items if v not in given]
        configs[name] = ",".join(items)
    return configs


async def apply_topic_configs(
    ctx: BrokerContext, topic: TopicInfo, configs: dict[str, str], validate_only: bool
) -> None:
    """Validate ``configs`` as the topic's whole set; unless ``validate_only``, store them and
    hand the new LogConfig to the topic's open partitions."""
    try:
        LogConfig.from_properties({**ctx.replicas.topic_defaults, **configs}, strict=True)
    except LogConfigError as e:
        raise ConfigRequestError(ErrorCode.INVALID_CONFIG, str(e)) from None
    if validate_only:
        return
    updated = await ctx.topics.update(topic, configs=configs)
    config = ctx.replicas.log_config(updated)
    for partition in ctx.open_partitions(topic.name):
        partition.log.config = config
        partition.max_message_bytes = config.max_message_bytes


def _alter_entry(kind: int, name: str) -> dict[str, Any]:
    return {
        "resource_type": kind,
        "resource_name": name,
        "error_code": ErrorCode.NONE,
        "error_message": None,
    }


def _refuse_alter(ctx: BrokerContext, kind: int, name: str, names: list[str]) -> None:
    if kind != ResourceType.BROKER:
        raise ConfigRequestError(ErrorCode.INVALID_REQUEST, f"unsupported resource type {kind}")
    if name != "":
        _check_broker(ctx, name)
    if names:
        raise ConfigRequestError(
            ErrorCode.INVALID_REQUEST,
            f"Cannot update these configs dynamically: {', '.join(sorted(names))} (automq-py "
            "reads broker configs once at start: set them in server.properties or --override)",
        )


def _check_unique(names: list[str]) -> None:
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)
    if repeated:
        raise ConfigRequestError(
            ErrorCode.INVALID_REQUEST, f"duplicate config keys: {', '.join(repeated)}"
        )


# -- resources ---------------------------------------------------------------------------------


def _topic(ctx: BrokerContext, name: str) -> TopicInfo:
    topic = ctx.topics.get(name)
    if topic is None:
        raise ConfigRequestError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
        )
    return topic


def _check_broker(ctx: BrokerContext, name: str) -> None:
    try:
        node = int(name)
    except ValueError:
        raise ConfigRequestError(
            ErrorCode.INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}"
        ) from None
    if node != ctx.node_id:
        raise ConfigRequestError(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {ctx.node_id} but received {node}",
        )


HANDLERS: dict[int, tuple[Any, int, int]] = {
    # v0 is not in kio's schemas (Kafka 4 dropped it too)
    ApiKey.DESCRIBE_CONFIGS: (handle_describe_configs, 1, 4),
    ApiKey.ALTER_CONFIGS: (handle_alter_configs, 0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (handle_incremental_alter_configs, 0, 1),
}
