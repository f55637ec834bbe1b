"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44).

A topic's configs are the :class:`LogConfig` properties: the topic's own values (stored with
the topic; source DYNAMIC_TOPIC_CONFIG) over the broker's ``log.*`` defaults
(STATIC_BROKER_CONFIG when the broker's properties set them, else DEFAULT_CONFIG), merged and
described by :mod:`automq_py.topic_config`.

A change is validated by :func:`effective_topic_config`, stored by :meth:`TopicRegistry.update`
and handed to the partitions already open, so ``max.message.bytes``, ``segment.bytes`` and
``segment.ms`` act on the next append; what a segment fixes when it is created
(``index.interval.bytes``, ``segment.index.bytes``) acts from the next segment on.

The broker resource lists every broker property: the dynamic ones (the broker defaults of topic
configs, ``log.cleaner.backoff.ms``, and ``advertised.listeners`` per broker:
:mod:`automq_py.dynamic_config`) are not
read-only, and altering any other is refused as Kafka refuses a static config
(INVALID_REQUEST). ``advertised.listeners`` is described as Kafka 3.9 describes it: a STRING,
null with no synonym where nothing sets it (Kafka's default is null, the listeners being
advertised then), else the value as given.

The broker logger resource (KIP-412: this broker's loggers and their levels, changed while it
runs) is :mod:`automq_py.apis.broker_loggers`'s.

Authorization is Kafka's (``ConfigHelper``, ``ControllerApis.authorizeAlterResource``): a topic
needs DESCRIBE_CONFIGS (ALTER_CONFIGS to alter) on the topic, a group on the group, a broker,
broker logger or client metrics resource on the cluster; a refused resource is answered
TOPIC_, GROUP_ or CLUSTER_AUTHORIZATION_FAILED and the others are served.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from enum import IntEnum
from typing import Any

from automq_py.apis import broker_loggers
from automq_py.apis.broker_loggers import BrokerLoggerError
from automq_py.apis.context import BrokerContext
from automq_py.config import BrokerConfig
from automq_py.coordinator.group_configs import KEYS as GROUP_CONFIG_KEYS
from automq_py.coordinator.group_configs import GroupConfigs
from automq_py.dynamic_config import DYNAMIC
from automq_py.log.log_config import LogConfig
from automq_py.security.acls import CLUSTER_NAME, AclOperation
from automq_py.security.acls import ResourceType as AclResource
from automq_py.topic_config import ConfigSource, ConfigSynonym, effective_topic_config
from automq_py.topics import TopicError, TopicInfo
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema
from storage.config_def import ConfigError, ConfigType, format_value, split_list


class ResourceType(IntEnum):
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32


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


# -- authorization -----------------------------------------------------------------------------

# a config resource type -> the ACL resource checked, and the error (with Kafka's message) of a
# refusal; the broker's own resources are the cluster's
_ACL_RESOURCES: dict[int, tuple[AclResource, ErrorCode, str]] = {
    ResourceType.TOPIC: (
        AclResource.TOPIC,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        "Topic authorization failed.",
    ),
    ResourceType.GROUP: (
        AclResource.GROUP,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        "Group authorization failed.",
    ),
    **{
        kind: (
            AclResource.CLUSTER,
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "Cluster authorization failed.",
        )
        for kind in (ResourceType.BROKER, ResourceType.BROKER_LOGGER, ResourceType.CLIENT_METRICS)
    },
}


def _authorize(ctx: BrokerContext, operation: AclOperation, kind: int, name: str) -> None:
    """Refuse (ConfigRequestError) a resource the session may not do ``operation`` on; a
    resource type with no ACL resource is left to the handler (INVALID_REQUEST)."""
    found = _ACL_RESOURCES.get(kind)
    if found is None:
        return
    acl_resource, code, message = found
    acl_name = CLUSTER_NAME if acl_resource == AclResource.CLUSTER else name
    if not ctx.allowed(operation, acl_resource, acl_name):
        raise ConfigRequestError(code, message)


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
            _authorize(ctx, AclOperation.DESCRIBE_CONFIGS, kind, name)
            if kind == ResourceType.TOPIC:
                configs = describe_topic(ctx, _topic(ctx, name), synonyms, documentation)
            elif kind == ResourceType.BROKER:
                configs = describe_broker(ctx, name, synonyms, documentation)
            elif kind == ResourceType.GROUP:
                configs = describe_group(ctx, name, synonyms, documentation)
            elif kind == ResourceType.BROKER_LOGGER:
                configs = broker_loggers.describe(ctx.node_id, name)
                entry["error_message"] = ""  # as Kafka sends it (its default, not set)
            else:
                raise ConfigRequestError(
                    ErrorCode.INVALID_REQUEST, f"unsupported resource type {kind}"
                )
            entry["configs"] = [c for c in configs if keys is None or c["name"] in keys]
        except ConfigRequestError as e:
            entry.update(error_code=e.code, error_message=str(e))
        except BrokerLoggerError as e:
            entry.update(error_code=e.code, error_message=e.message)
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
        for c in effective.describe(ctx.config_layers())
    ]


def describe_broker(
    ctx: BrokerContext, name: str, synonyms: bool, documentation: bool
) -> list[dict[str, Any]]:
    """The broker resource as Kafka's ConfigHelper describes it: for this broker's id every
    property with its value in effect (null where nothing sets it), its source and synonyms,
    read-only unless it can change dynamically; for the empty name (the cluster-wide dynamic
    defaults) only the properties set there. Secrets are redacted."""
    if name != "":
        _check_broker(ctx, name, describing=True)
    layers = ctx.config_layers()
    shown = ctx.config.all_properties()
    plain = ctx.config.all_properties(redact=False)
    keys = BrokerConfig.config_keys()
    if name == "":
        values: dict[str, str | None] = dict(layers.dynamic_default)
    else:
        values = {n: None for n in keys}
        values.update(shown)
        values.update(layers.dynamic_default)
        values.update(layers.dynamic_broker)
    out = []
    for prop, value in sorted(values.items()):
        sensitive = prop in shown and shown[prop] != plain.get(prop)
        chain = layers.synonyms(prop)
        if name == "":
            chain = [c for c in chain if c.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG]
        if prop in _NULL_DEFAULTS:
            chain = [c for c in chain if c.source != ConfigSource.DEFAULT_CONFIG]
            value = chain[0].value if chain else None
        if sensitive:
            # as Kafka: a secret's value is never sent, only that there is one
            chain = [ConfigSynonym(c.name, None, c.source) for c in chain]
        key = keys.get(prop)
        # a property automq-py does not read is shown as the text it was given
        config_type, doc = (key.type, key.doc or None) if key else (ConfigType.STRING, None)
        out.append(
            {
                "name": prop,
                "value": None if sensitive else value,
                "read_only": prop not in DYNAMIC,
                "config_source": chain[0].source if chain else ConfigSource.DEFAULT_CONFIG,
                "is_sensitive": sensitive,
                "synonyms": _synonyms(chain) if synonyms else [],
                "config_type": config_type,
                "documentation": doc if documentation else None,
            }
        )
    return out


# broker properties whose Kafka default is null, though automq-py derives a value in effect
# (the advertised listeners are the listeners, but the controller's, when it is unset)
_NULL_DEFAULTS = frozenset({"advertised.listeners"})


def describe_group(
    ctx: BrokerContext, name: str, synonyms: bool, documentation: bool
) -> list[dict[str, Any]]:
    """A consumer group's configs (KIP-848): its own value of each (DYNAMIC_GROUP_CONFIG), else
    the broker property giving the default, for any group id, as Kafka describes them."""
    configs = _group_configs(ctx, name)
    own = configs.own(name)
    out = []
    for key in GROUP_CONFIG_KEYS.values():
        default, static = configs.broker_default(key)
        chain = [
            ConfigSynonym(
                key.default_property,
                default,
                ConfigSource.STATIC_BROKER_CONFIG if static else ConfigSource.DEFAULT_CONFIG,
            )
        ]
        if key.name in own:
            chain.insert(
                0, ConfigSynonym(key.name, own[key.name], ConfigSource.DYNAMIC_GROUP_CONFIG)
            )
        out.append(
            {
                "name": key.name,
                "value": chain[0].value,
                "read_only": False,
                "config_source": chain[0].source,
                "is_sensitive": False,
                "synonyms": _synonyms(chain) if synonyms else [],
                "config_type": ConfigType.INT,
                "documentation": key.doc if documentation else None,
            }
        )
    return out


def _synonyms(chain: Sequence[ConfigSynonym]) -> list[dict[str, Any]]:
    return [{"name": c.name, "value": c.value, "source": c.source} for c in chain]


# -- AlterConfigs, IncrementalAlterConfigs ---------------------------------------------------


async def handle_alter_configs(ctx: BrokerContext, request: Request) -> Any:
    """Replace the whole set of a topic's configs (a config left out returns to its default)."""

    def replace_all(current: Any, entries: Any, inherited: Any, is_list: Any) -> dict[str, str]:
        return {str(c.name): str(c.value) for c in entries}  # (no null: _check_values)

    return await _alter(ctx, request, 33, replace_all)


async def handle_incremental_alter_configs(ctx: BrokerContext, request: Request) -> Any:
    """SET, DELETE, APPEND to or SUBTRACT from a topic's configs; the rest stay as they are."""
    return await _alter(ctx, request, 44, incremental_configs)


async def _alter(
    ctx: BrokerContext,
    request: Request,
    api_key: int,
    new_configs: NewConfigs,
) -> Any:
    """The shared walk of both alter APIs: per resource, check the names, compute the
    resource's new configs with ``new_configs`` and apply them."""
    body = request.body
    responses = []
    named = Counter((int(r.resource_type), str(r.resource_name)) for r in body.resources)
    for r in body.resources:
        kind, name = int(r.resource_type), str(r.resource_name)
        entry = _alter_entry(kind, name)
        try:
            if named[kind, name] > 1:
                # as Kafka's ConfigAdminManager.preprocess: neither is altered
                raise ConfigRequestError(
                    ErrorCode.INVALID_REQUEST, "Each resource must appear at most once."
                )
            if kind == ResourceType.BROKER_LOGGER:
                # checked and authorized in Kafka's order, by broker_loggers
                alter_broker_loggers(ctx, api_key, name, r.configs, bool(body.validate_only))
                responses.append(entry)
                continue
            _authorize(ctx, AclOperation.ALTER_CONFIGS, kind, name)
            names = [str(c.name) for c in r.configs]
            _check_unique(names)
            _check_values(api_key, r.configs)
            if kind == ResourceType.TOPIC:
                topic = _topic(ctx, name)
                configs = new_configs(
                    topic.configs, r.configs, _topic_schema_default, _is_topic_list
                )
                await apply_topic_configs(ctx, topic, configs, bool(body.validate_only))
            elif kind == ResourceType.BROKER:
                await alter_broker(ctx, name, r.configs, new_configs, bool(body.validate_only))
            elif kind == ResourceType.GROUP:
                group_configs = _group_configs(ctx, name)
                configs = new_configs(
                    group_configs.own(name), r.configs, lambda _: None, lambda _: False
                )
                await alter_group(group_configs, name, configs, bool(body.validate_only))
            else:
                raise ConfigRequestError(
                    ErrorCode.INVALID_REQUEST, f"unsupported resource type {kind}"
                )
        except ConfigRequestError as e:
            entry.update(error_code=e.code, error_message=str(e))
        except BrokerLoggerError as e:
            entry.update(error_code=e.code, error_message=e.message)
        responses.append(entry)
    return build.build(
        response_schema(api_key, request.api_version), {"throttle_time": 0, "responses": responses}
    )


def incremental_configs(
    current: Mapping[str, str],
    ops: Any,
    inherited: Callable[[str], str | None],
    is_list: Callable[[str], bool],
) -> dict[str, str]:
    """A resource's configs ``current`` after ``ops`` (each with name, config_operation,
    value); APPEND and SUBTRACT start from ``inherited(name)`` where the resource has no
    value of its own, and apply to the configs ``is_list`` says are lists (Kafka's
    ConfigurationControlManager: each item appended unless the list has it, each subtracted
    item removed)."""
    configs = dict(current)
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
        if not is_list(name):
            verb = "APPEND" if kind == OpType.APPEND else "SUBTRACT"
            raise ConfigRequestError(
                ErrorCode.INVALID_CONFIG,
                f"Can't {verb} to key {name} because its type is not LIST.",
            )
        # the list the resource has now: its own value, else what it inherits
        own = configs.get(name)
        items = list(split_list(own if own is not None else inherited(name) or ""))
        given = split_list(str(value))
        if kind == OpType.APPEND:
            for item in given:
                if item not in items:
                    items.append(item)
        else:
            items = [v for v in items if v not in given]
        configs[name] = ",".join(items)
    return configs


# (current configs, entries, inherited value, is a list config) -> the new configs
NewConfigs = Callable[
    [Mapping[str, str], Any, Callable[[str], "str | None"], Callable[[str], bool]],
    dict[str, str],
]


def _topic_schema_default(name: str) -> str | None:
    """What a topic config the topic does not set starts from in APPEND and SUBTRACT: the
    topic schema's default, as Kafka's controller takes it (not the broker's default)."""
    found = LogConfig.properties().get(name)
    return None if found is None else format_value(found[1].default)


def _is_topic_list(name: str) -> bool:
    found = LogConfig.properties().get(name)
    return found is not None and found[1].type is ConfigType.LIST


async def alter_broker(
    ctx: BrokerContext, name: str, entries: Any, new_configs: NewConfigs, validate_only: bool
) -> None:
    """Set the dynamic configs of broker resource ``name`` (this broker's id, or the empty
    name for the cluster-wide defaults) and hand the new topic defaults to every topic's open
    partitions."""
    if name != "":
        _check_broker(ctx, name)
    dynamic = ctx.dynamic_config
    if dynamic is None:
        raise ConfigRequestError(ErrorCode.INVALID_REQUEST, "the broker is not started")
    layers = dynamic.layers()
    keys = BrokerConfig.config_keys()

    def inherited(prop: str) -> str | None:
        # as Kafka's controller: a list the resource does not set starts from the property's
        # default, not from another layer's value
        return layers.defaults.get(prop)

    def is_list(prop: str) -> bool:
        key = keys.get(prop)
        return key is not None and key.type is ConfigType.LIST

    configs = new_configs(dynamic.current(name), entries, inherited, is_list)
    try:
        if validate_only:
            dynamic.validate(name, configs)
            return
        defaults = await dynamic.alter(name, configs)
    except ConfigError as e:
        # Kafka's broker answers any refused broker config INVALID_REQUEST (KAFKA-13609)
        raise ConfigRequestError(ErrorCode.INVALID_REQUEST, str(e)) from None
    ctx.replicas.topic_defaults = defaults
    for topic in ctx.topics.all():
        ctx.replicas.apply_config(topic)


def alter_broker_loggers(
    ctx: BrokerContext, api_key: int, name: str, entries: Any, validate_only: bool
) -> None:
    """Set or unset the levels of this broker's loggers (IncrementalAlterConfigs; legacy
    AlterConfigs is refused, as by Kafka), at once unless ``validate_only``."""
    if api_key != ApiKey.INCREMENTAL_ALTER_CONFIGS:
        raise broker_loggers.refuse_legacy_alter(
            [(str(c.name), None if c.value is None else str(c.value)) for c in entries]
        )
    ops = [
        (str(c.name), int(c.config_operation), None if c.value is None else str(c.value))
        for c in entries
    ]
    allowed = ctx.allowed(AclOperation.ALTER_CONFIGS, AclResource.CLUSTER, CLUSTER_NAME)
    changes = broker_loggers.plan_alter(
        ctx.node_id, name, ops, allowed, broker_loggers.logger_exists
    )
    if not validate_only:
        broker_loggers.apply(changes)


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
    try:
        updated = await ctx.topics.update(topic, configs=configs)
    except TopicError as e:  # deleted meanwhile, through another broker
        raise ConfigRequestError(ErrorCode(e.code), str(e)) from None
    ctx.replicas.apply_config(updated)


async def alter_group(
    configs: GroupConfigs, group_id: str, new: dict[str, str], validate_only: bool
) -> None:
    """Make ``new`` consumer group ``group_id``'s configs, checked as Kafka checks them."""
    try:
        if validate_only:
            configs.validate(new)
        else:
            await configs.alter(group_id, new)
    except ConfigError as e:
        raise ConfigRequestError(ErrorCode.INVALID_CONFIG, str(e)) from None


def _alter_entry(kind: int, name: str) -> dict[str, Any]:
    return {
        "resource_type": kind,
        "resource_name": name,
        "error_code": ErrorCode.NONE,
        "error_message": None,
    }


def _check_unique(names: list[str]) -> None:
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)
    if repeated:
        raise ConfigRequestError(
            ErrorCode.INVALID_REQUEST,
            f"Error due to duplicate config keys ({', '.join(repeated)})",
        )


def _check_values(api_key: int, entries: Any) -> None:
    """Kafka's broker refuses a null value before it looks at the resource: any in a legacy
    AlterConfigs, any but a DELETE's in an IncrementalAlterConfigs."""
    nulls = [
        str(c.name)
        for c in entries
        if c.value is None
        and (
            api_key != ApiKey.INCREMENTAL_ALTER_CONFIGS or int(c.config_operation) != OpType.DELETE
        )
    ]
    if nulls:
        raise ConfigRequestError(
            ErrorCode.INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls)
        )


# -- resources ---------------------------------------------------------------------------------


def _topic(ctx: BrokerContext, name: str) -> TopicInfo:
    topic = ctx.topics.get(name)
    if topic is None:
        raise ConfigRequestError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
        )
    return topic


def _group_configs(ctx: BrokerContext, group_id: str) -> GroupConfigs:
    if not group_id:
        raise ConfigRequestError(ErrorCode.INVALID_REQUEST, "Group name must not be empty")
    if ctx.group_configs is None:
        raise ConfigRequestError(ErrorCode.INVALID_REQUEST, "the broker is not started")
    return ctx.group_configs


def _check_broker(ctx: BrokerContext, name: str, *, describing: bool = False) -> None:
    try:
        node = int(name)
    except ValueError:
        raise ConfigRequestError(
            ErrorCode.INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}"
        ) from None
    if node != ctx.node_id:
        expected = f"{ctx.node_id} or empty string," if describing else str(ctx.node_id)
        raise ConfigRequestError(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {expected} but received {node}",
        )


HANDLERS: dict[int, tuple[Any, int, int]] = {
    # Kafka 3.9's maxima; DescribeConfigs v0 (Kafka 3.9 has it) is not in kio's schemas (Kafka
    # 4.0 removed it, KIP-896)
    ApiKey.DESCRIBE_CONFIGS: (handle_describe_configs, 1, 4),
    ApiKey.ALTER_CONFIGS: (handle_alter_configs, 0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (handle_incremental_alter_configs, 0, 1),
}
