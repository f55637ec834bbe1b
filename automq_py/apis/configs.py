"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44).

A topic's configs are the :class:`LogConfig` properties: the topic's own values (stored with
the topic; source DYNAMIC_TOPIC_CONFIG) over the broker's ``log.*`` defaults
(STATIC_BROKER_CONFIG when the broker's properties set them, else DEFAULT_CONFIG), merged and
described by :mod:`automq_py.topic_config`.

A change is validated by :func:`effective_topic_config`, stored by :meth:`TopicRegistry.update`
and handed to the partitions already open, so ``max.message.bytes``, ``segment.bytes`` and
``segment.ms`` act on the next append; what a segment fixes when it is created
(``index.interval.bytes``, ``segment.index.bytes``) acts from the next segment on.

The broker resource lists every broker property, read-only: automq-py reads its configuration
once at start and keeps no dynamic broker configs, so altering one is refused as Kafka refuses
a static config (INVALID_REQUEST).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.config import BrokerConfig, default_properties
from automq_py.log.log_config import LogConfig
from automq_py.topic_config import ConfigSource, ConfigSynonym, effective_topic_config
from automq_py.topics import TopicInfo
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema
from storage.config_def import ConfigError, ConfigType, split_list


class ResourceType(IntEnum):
    TOPIC = 2
    BROKER = 4


class OpType(IntEnum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


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
    effective = effective_topic_config(ctx.replicas.topic_defaults, topic.configs)
    return [
        {
            "name": c.name,
            "value": c.value,
            "read_only": False,
            "config_source": c.source,
            "is_sensitive": False,
            "synonyms": _synonyms(c.synonyms) if synonyms else [],
            "config_type": c.type,
            "documentation": c.doc if documentation else None,
        }
        for c in effective.describe(ctx.config)
    ]


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
    defaults = default_properties()
    keys = BrokerConfig.config_keys()
    out = []
    for prop, value in shown.items():
        chain: list[ConfigSynonym] = []
        if prop in config.properties:
            chain.append(ConfigSynonym(prop, value, ConfigSource.STATIC_BROKER_CONFIG))
        if prop in defaults:
            chain.append(ConfigSynonym(prop, defaults[prop], ConfigSource.DEFAULT_CONFIG))
        source = chain[0].source if chain else ConfigSource.DEFAULT_CONFIG
        key = keys.get(prop)
        # a property automq-py does not read is shown as the text it was given
        config_type, doc = (key.type, key.doc or None) if key else (ConfigType.STRING, None)
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


def _synonyms(chain: Sequence[ConfigSynonym]) -> list[dict[str, Any]]:
    return [{"name": c.name, "value": c.value, "source": c.source} for c in chain]


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
    inherited = effective_topic_config(ctx.replicas.topic_defaults, {})
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
        if found is None or found[1].type is not ConfigType.LIST:
            verb = "append" if kind == OpType.APPEND else "subtract"
            raise ConfigRequestError(
                ErrorCode.INVALID_CONFIG, f"{name}: {verb} applies to list configs only"
            )
        # the list the topic has now: its own value, else what it inherits
        current = configs.get(name) or inherited.value(name)
        items = list(split_list(current))
        given = split_list(str(value))
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
        effective_topic_config(ctx.replicas.topic_defaults, configs, strict=True)
    except ConfigError as e:
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
    # Kafka 3.9's maxima; DescribeConfigs v0 (Kafka 3.9 has it) is not in kio's schemas (Kafka
    # 4.0 removed it, KIP-896)
    ApiKey.DESCRIBE_CONFIGS: (handle_describe_configs, 1, 4),
    ApiKey.ALTER_CONFIGS: (handle_alter_configs, 0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (handle_incremental_alter_configs, 0, 1),
}
