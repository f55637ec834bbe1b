"""CreateTopics and CreatePartitions: the replication factor and manual replica assignments.

A partition has one replica here (object storage keeps the data durable; every broker can serve
any partition), so any replication factor Kafka accepts is accepted and recorded as one replica,
and an assignment naming this cluster's brokers is accepted; what Kafka refuses is refused with
Kafka's error codes and messages. The handlers run in-process, over a real embedded store."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin.configs import (
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.admin.topics import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from automq_py.apis.configs import describe_topic
from automq_py.apis.context import BrokerContext
from automq_py.apis.topics import (
    check_new_partition_assignments,
    manual_partition_count,
    requested_replication,
)
from automq_py.config import BrokerConfig
from automq_py.replica_manager import ReplicaManager
from automq_py.topics import TopicError, TopicRegistry
from protocol.errors import ErrorCode
from storage.s3_storage import S3Storage
from tests.automq_py.test_topic_config import call

BAD_FACTOR = "Replication factor must be larger than 0, or -1 to use the default value."
UNKNOWN_BROKER = (
    "The manual partition assignment includes broker {}, but no such broker is registered."
)
ONE_REPLICA_LOG = "recorded as one replica per partition"
BROKERS = frozenset({0})

MakeContext = Callable[..., Awaitable[BrokerContext]]


@pytest.fixture
async def make_ctx(tmp_path: Path) -> AsyncIterator[MakeContext]:
    """BrokerContexts over real embedded stores, as Broker.start builds them (no sockets), with
    extra broker properties."""
    opened: list[tuple[ReplicaManager, S3Storage]] = []

    async def make(**properties: str) -> BrokerContext:
        config = BrokerConfig.from_properties(
            {
                "log.dirs": str(tmp_path / f"data{len(opened)}"),
                "s3.wal.capacity": str(32 << 20),
                "s3.wal.upload.threshold": str(8 << 20),
                **properties,
            }
        )
        storage = await S3Storage.start(config.storage)
        replicas = ReplicaManager(storage, config.topic_defaults())
        opened.append((replicas, storage))
        return BrokerContext(
            node_id=config.node_id,
            cluster_id=config.cluster_id,
            host="127.0.0.1",
            port=9092,
            topics=TopicRegistry(storage.metadata),
            replicas=replicas,
            auto_create_topics=False,
            num_partitions=1,
            config=config,
        )

    yield make
    for replicas, storage in opened:
        await replicas.close()
        await storage.close()


@pytest.fixture
async def ctx(make_ctx: MakeContext) -> BrokerContext:
    return await make_ctx()


def new_topic(
    name: str,
    partitions: int = 1,
    replication_factor: int = 1,
    assignments: dict[int, list[int]] | None = None,
) -> Any:
    topic = CreateTopicsRequest.CreatableTopic
    assignment = topic.CreatableReplicaAssignment
    return topic(
        name=name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        assignments=[
            assignment(partition_index=i, broker_ids=b) for i, b in (assignments or {}).items()
        ],
        configs=[],
    )


async def create_topics(ctx: BrokerContext, *topics: Any, validate_only: bool = False) -> Any:
    request = CreateTopicsRequest[7](
        topics=list(topics), timeout_ms=5000, validate_only=validate_only
    )
    return (await call(ctx, request, CreateTopicsResponse)).topics


async def create_partitions(
    ctx: BrokerContext, name: str, count: int, assignments: list[list[int]] | None
) -> Any:
    topic = CreatePartitionsRequest.CreatePartitionsTopic
    request = CreatePartitionsRequest[3](
        topics=[
            topic(
                name=name,
                count=count,
                assignments=None
                if assignments is None
                else [topic.CreatePartitionsAssignment(broker_ids=b) for b in assignments],
            )
        ],
        timeout_ms=5000,
        validate_only=False,
    )
    (result,) = (await call(ctx, request, CreatePartitionsResponse)).results
    return result


async def replica_sets(
    ctx: BrokerContext, name: str
) -> list[tuple[int, int, list[int], list[int]]]:
    """Each partition of ``name`` as Metadata shows it: (index, leader, replicas, ISR)."""
    request = MetadataRequest[12](
        topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=name)],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    (topic,) = (await call(ctx, request, MetadataResponse)).topics
    assert topic.error_code == ErrorCode.NONE
    return sorted(
        (p.partition_index, p.leader_id, list(p.replica_nodes), list(p.isr_nodes))
        for p in topic.partitions
    )


def one_replica_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "automq.apis.topics" and ONE_REPLICA_LOG in r.getMessage()
    ]


# -- the decisions -------------------------------------------------------------------------------


def test_a_requested_factor_is_its_own_or_the_default() -> None:
    assert requested_replication(3, default=1) == 3
    assert requested_replication(1, default=3) == 1
    assert requested_replication(-1, default=3) == 3
    assert requested_replication(-1, default=1) == 1


@pytest.mark.parametrize("factor", [0, -2, -32768])
def test_a_factor_of_zero_or_below_minus_one_is_refused(factor: int) -> None:
    with pytest.raises(TopicError) as refused:
        requested_replication(factor, default=1)
    assert refused.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert str(refused.value) == BAD_FACTOR


def test_a_manual_assignment_of_this_broker_gives_its_partition_count() -> None:
    assert manual_partition_count(-1, -1, [(0, [0]), (1, [0]), (2, [0])], BROKERS) == 3
    assert manual_partition_count(-1, -1, [(1, [0]), (0, [0])], BROKERS) == 2


@pytest.mark.parametrize(
    ("partitions", "factor", "assignments", "code", "message"),
    [
        (
            -1,
            3,
            [(0, [0])],
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but replication factor was not set "
            "to -1.",
        ),
        (
            1,
            -1,
            [(0, [0])],
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but numPartitions was not set to -1.",
        ),
        (
            -1,
            -1,
            [(0, [0]), (0, [0])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "Found multiple manual partition assignments for partition 0",
        ),
        (-1, -1, [(0, [0, 1, 2])], ErrorCode.INVALID_REPLICA_ASSIGNMENT, UNKNOWN_BROKER.format(1)),
        (-1, -1, [(0, [5])], ErrorCode.INVALID_REPLICA_ASSIGNMENT, UNKNOWN_BROKER.format(5)),
        (
            -1,
            -1,
            [(0, [])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes an empty replica list.",
        ),
        (
            -1,
            -1,
            [(0, [0, 0])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes the broker 0 more than once.",
        ),
        (
            -1,
            -1,
            [(0, [0]), (2, [0])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "partitions should be a consecutive 0-based integer sequence",
        ),
    ],
)
def test_a_manual_assignment_is_refused_as_kafka_refuses_it(
    partitions: int,
    factor: int,
    assignments: list[tuple[int, list[int]]],
    code: ErrorCode,
    message: str,
) -> None:
    with pytest.raises(TopicError) as refused:
        manual_partition_count(partitions, factor, assignments, BROKERS)
    assert (refused.value.code, str(refused.value)) == (code, message)


def test_new_partitions_assignments_name_registered_brokers_one_list_each() -> None:
    check_new_partition_assignments(2, [[0], [0]], BROKERS)
    with pytest.raises(TopicError) as refused:
        check_new_partition_assignments(2, [[0]], BROKERS)
    assert (refused.value.code, str(refused.value)) == (
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified.",
    )
    with pytest.raises(TopicError) as refused:
        check_new_partition_assignments(1, [[0, 3]], BROKERS)
    assert (refused.value.code, str(refused.value)) == (
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        UNKNOWN_BROKER.format(3),
    )


# -- the handlers --------------------------------------------------------------------------------


async def test_replication_factor_3_is_created_with_one_replica(
    ctx: BrokerContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="automq.apis.topics")
    (result,) = await create_topics(ctx, new_topic("schemas", 2, 3))

    assert (result.error_code, result.error_message) == (ErrorCode.NONE, None)
    assert (result.num_partitions, result.replication_factor) == (2, 1)
    assert await replica_sets(ctx, "schemas") == [(0, 0, [0], [0]), (1, 0, [0], [0])]
    (line,) = one_replica_logs(caplog)
    assert line.startswith("topic schemas: replication factor 3 recorded as one replica")
    assert "object storage keeps the data durable" in line
    assert "every broker can serve any partition" in line


async def test_factor_1_and_a_validation_log_nothing(
    ctx: BrokerContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="automq.apis.topics")
    (checked,) = await create_topics(ctx, new_topic("checked", 1, 3), validate_only=True)
    (single,) = await create_topics(ctx, new_topic("single", 1, 1))

    assert (checked.error_code, checked.replication_factor) == (ErrorCode.NONE, 1)
    assert ctx.topics.get("checked") is None
    assert (single.error_code, single.replication_factor) == (ErrorCode.NONE, 1)
    assert one_replica_logs(caplog) == []


async def test_default_replication_factor_3_gives_one_replica(
    make_ctx: MakeContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="automq.apis.topics")
    ctx = await make_ctx(**{"default.replication.factor": "3"})
    (result,) = await create_topics(ctx, new_topic("connect-offsets", 1, -1))

    assert (result.error_code, result.replication_factor) == (ErrorCode.NONE, 1)
    assert await replica_sets(ctx, "connect-offsets") == [(0, 0, [0], [0])]
    (line,) = one_replica_logs(caplog)
    assert "replication factor 3 (default.replication.factor) recorded as one" in line


@pytest.mark.parametrize("factor", [0, -2])
async def test_factor_0_or_minus_2_is_refused(ctx: BrokerContext, factor: int) -> None:
    (result,) = await create_topics(ctx, new_topic("refused", 1, factor))

    assert (result.error_code, result.error_message) == (
        ErrorCode.INVALID_REPLICATION_FACTOR,
        BAD_FACTOR,
    )
    assert (result.num_partitions, result.replication_factor) == (-1, -1)
    assert ctx.topics.get("refused") is None


async def test_a_manual_assignment_creates_one_replica_per_partition(ctx: BrokerContext) -> None:
    placed, elsewhere, factor_too = await create_topics(
        ctx,
        new_topic("placed", -1, -1, {0: [0], 1: [0], 2: [0]}),
        new_topic("elsewhere", -1, -1, {0: [0], 1: [2]}),
        new_topic("factor-too", -1, 3, {0: [0]}),
    )

    assert (placed.error_code, placed.num_partitions, placed.replication_factor) == (
        ErrorCode.NONE,
        3,
        1,
    )
    assert await replica_sets(ctx, "placed") == [(p, 0, [0], [0]) for p in range(3)]
    assert (elsewhere.error_code, elsewhere.error_message) == (
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        UNKNOWN_BROKER.format(2),
    )
    assert factor_too.error_code == ErrorCode.INVALID_REQUEST
    assert ctx.topics.get("elsewhere") is None and ctx.topics.get("factor-too") is None


async def test_create_partitions_with_assignments(ctx: BrokerContext) -> None:
    (created,) = await create_topics(ctx, new_topic("growing", 1, 3))
    assert created.error_code == ErrorCode.NONE

    grown = await create_partitions(ctx, "growing", 3, [[0], [0]])
    assert (grown.error_code, grown.error_message) == (ErrorCode.NONE, None)
    assert await replica_sets(ctx, "growing") == [(p, 0, [0], [0]) for p in range(3)]

    elsewhere = await create_partitions(ctx, "growing", 4, [[1]])
    assert (elsewhere.error_code, elsewhere.error_message) == (
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        UNKNOWN_BROKER.format(1),
    )
    too_few = await create_partitions(ctx, "growing", 5, [[0]])
    assert too_few.error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    topic = ctx.topics.get("growing")
    assert topic is not None and topic.partitions == 3


async def test_metadata_answers_again_from_its_encoded_response_until_a_topic_changes(
    ctx: BrokerContext,
) -> None:
    """A Metadata response is encoded once per question and state: asked again, the same
    bytes under the new request's correlation id; once the topic grew, its new partitions."""
    (created,) = await create_topics(ctx, new_topic("cached", 2, 1))
    assert created.error_code == ErrorCode.NONE
    first = await replica_sets(ctx, "cached")
    assert [p[0] for p in first] == [0, 1]
    assert len(ctx.metadata_responses) == 1
    assert await replica_sets(ctx, "cached") == first
    assert len(ctx.metadata_responses) == 1  # the same question: answered from it

    grown = await create_partitions(ctx, "cached", 3, None)
    assert grown.error_code == ErrorCode.NONE
    assert [p[0] for p in await replica_sets(ctx, "cached")] == [0, 1, 2]
    assert len(ctx.metadata_responses) == 1  # the older state's answer dropped


async def test_metadata_for_a_missing_topic_is_not_kept(ctx: BrokerContext) -> None:
    request = MetadataRequest[12](
        topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name="absent")],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    (topic,) = (await call(ctx, request, MetadataResponse)).topics
    assert topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert ctx.metadata_responses == {}


async def test_a_name_given_twice_is_refused_and_created_by_neither(ctx: BrokerContext) -> None:
    """As Kafka's controller answers CreateTopics: INVALID_REQUEST once for a duplicated
    name, which is not created; the other topics of the request are."""
    results = await create_topics(ctx, new_topic("once"), new_topic("twice"), new_topic("twice"))
    by_name = {r.name: (r.error_code, r.error_message) for r in results}
    assert len(results) == 2
    assert by_name == {
        "once": (ErrorCode.NONE, None),
        "twice": (ErrorCode.INVALID_REQUEST, "Duplicate topic name."),
    }
    assert ctx.topics.get("twice") is None and ctx.topics.get("once") is not None


async def test_kafkas_metadata_log_is_no_topic_to_create(ctx: BrokerContext) -> None:
    [result] = await create_topics(ctx, new_topic("__cluster_metadata"))
    assert (result.error_code, result.error_message) == (
        ErrorCode.INVALID_REQUEST,
        "Creation of internal topic __cluster_metadata is prohibited.",
    )
    assert ctx.topics.get("__cluster_metadata") is None


def _metadata_request(*names: str, auto: bool = True) -> Any:
    return MetadataRequest[12](
        topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=n) for n in names],
        allow_auto_topic_creation=auto,
        include_topic_authorized_operations=False,
    )


async def test_metadata_that_auto_creates_a_topic_answers_leader_not_available_first(
    ctx: BrokerContext,
) -> None:
    """Kafka's AutoTopicCreationManager answers the Metadata request that creates a topic with
    LEADER_NOT_AVAILABLE and no partitions; the client's next request finds the topic."""
    ctx.auto_create_topics = True
    (first,) = (await call(ctx, _metadata_request("auto"), MetadataResponse)).topics
    assert (first.name, first.error_code, list(first.partitions)) == (
        "auto",
        ErrorCode.LEADER_NOT_AVAILABLE,
        [],
    )
    (again,) = (await call(ctx, _metadata_request("auto"), MetadataResponse)).topics
    assert again.error_code == ErrorCode.NONE and len(again.partitions) == 1


async def test_metadata_names_an_illegal_topic_invalid_whether_or_not_it_creates(
    ctx: BrokerContext,
) -> None:
    """Kafka checks the name of a topic it does not have: an illegal one is
    INVALID_TOPIC_EXCEPTION (the Java producer fails at once, where an unknown topic has it
    wait max.block.ms), with auto-creation or without."""
    for auto in (True, False):
        ctx.auto_create_topics = auto
        response = await call(ctx, _metadata_request("bad name!", "", auto=auto), MetadataResponse)
        assert [(t.name, t.error_code) for t in response.topics] == [
            ("bad name!", ErrorCode.INVALID_TOPIC_EXCEPTION),
            ("", ErrorCode.INVALID_TOPIC_EXCEPTION),
        ]
    assert ctx.topics.get("bad name!") is None


async def test_metadata_does_not_auto_create_a_colliding_name(ctx: BrokerContext) -> None:
    ctx.auto_create_topics = True
    assert (await create_topics(ctx, new_topic("a.b")))[0].error_code == ErrorCode.NONE
    for _ in range(2):
        (answer,) = (await call(ctx, _metadata_request("a_b"), MetadataResponse)).topics
        assert answer.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert ctx.topics.get("a_b") is None


async def test_an_existing_topic_is_already_there_whatever_else_is_asked(
    ctx: BrokerContext,
) -> None:
    """Kafka's controller checks whether the topic exists before its configs and partitions,
    so `kafka-topics.sh --create --if-not-exists` succeeds against an existing topic whatever
    its other arguments; a config with no value is INVALID_CONFIG."""
    assert (await create_topics(ctx, new_topic("here")))[0].error_code == ErrorCode.NONE
    for again in (new_topic("here", replication_factor=0), new_topic("here", partitions=0)):
        (result,) = await create_topics(ctx, again)
        assert (result.error_code, result.error_message) == (
            ErrorCode.TOPIC_ALREADY_EXISTS,
            "Topic 'here' already exists.",
        )
    unset = new_topic("unset")
    unset.configs = [
        CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(name="retention.ms", value=None)
    ]
    (result,) = await create_topics(ctx, unset)
    assert (result.error_code, result.error_message) == (
        ErrorCode.INVALID_CONFIG,
        "Null value not supported for topic configs: retention.ms",
    )


async def test_a_name_that_collides_with_a_topics_is_refused(ctx: BrokerContext) -> None:
    """'.' and '_' make the same metric names, so Kafka refuses a topic whose name differs
    from an existing one's only by them."""
    assert (await create_topics(ctx, new_topic("orders_eu")))[0].error_code == ErrorCode.NONE
    (result,) = await create_topics(ctx, new_topic("orders.eu"))
    assert (result.error_code, result.error_message) == (
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        "Topic 'orders.eu' collides with existing topic: orders_eu",
    )
    assert ctx.topics.get("orders.eu") is None
    assert (await create_topics(ctx, new_topic("orders-eu")))[0].error_code == ErrorCode.NONE


async def test_with_delete_topic_enable_false_no_topic_is_deleted(make_ctx: MakeContext) -> None:
    from kafka.protocol.admin import DeleteTopicsRequest, DeleteTopicsResponse

    ctx = await make_ctx(**{"delete.topic.enable": "false"})
    assert (await create_topics(ctx, new_topic("kept")))[0].error_code == ErrorCode.NONE
    for version, code in ((6, ErrorCode.TOPIC_DELETION_DISABLED), (2, ErrorCode.INVALID_REQUEST)):
        if version >= 6:
            request = DeleteTopicsRequest[version](
                topics=[DeleteTopicsRequest.DeleteTopicState(name="kept", topic_id=None)],
                timeout_ms=5000,
            )
        else:
            request = DeleteTopicsRequest[version](topic_names=["kept"], timeout_ms=5000)
        (result,) = (await call(ctx, request, DeleteTopicsResponse)).responses
        assert result.error_code == code, version
    assert ctx.topics.get("kept") is not None


async def test_delete_topics_refuses_the_rows_kafkas_controller_refuses(ctx: BrokerContext) -> None:
    """Before it deletes anything, Kafka's controller refuses with INVALID_REQUEST a row with
    neither a name nor an id, one with both, a name or an id given twice (answered once), and a
    name whose topic another row names by id; the request's other rows are deleted."""
    import uuid

    from kafka.protocol.admin import DeleteTopicsRequest, DeleteTopicsResponse

    for name in ("twice", "both", "named", "gone"):
        assert (await create_topics(ctx, new_topic(name)))[0].error_code == ErrorCode.NONE
    named_id = ctx.topics.get("named").topic_id  # type: ignore[union-attr]
    both_id = ctx.topics.get("both").topic_id  # type: ignore[union-attr]
    gone_id = str(ctx.topics.get("gone").topic_id)  # type: ignore[union-attr]
    zero = uuid.UUID(int=0)
    state = DeleteTopicsRequest.DeleteTopicState
    request = DeleteTopicsRequest[6](
        topics=[
            state(name=None, topic_id=zero),
            state(name="both", topic_id=both_id),
            state(name="twice", topic_id=zero),
            state(name="twice", topic_id=zero),
            state(name=None, topic_id=named_id),
            state(name="named", topic_id=zero),
            state(name="gone", topic_id=zero),
        ],
        timeout_ms=5000,
    )
    answers = (await call(ctx, request, DeleteTopicsResponse)).responses
    got = sorted(
        ((r.name or "", str(r.topic_id or zero), r.error_code, r.error_message) for r in answers),
        key=lambda a: (a[0], a[1]),
    )
    assert got == sorted(
        [
            ("", str(zero), ErrorCode.INVALID_REQUEST, "Neither topic name nor id were specified."),
            (
                "both",
                str(both_id),
                ErrorCode.INVALID_REQUEST,
                "You may not specify both topic name and topic id.",
            ),
            ("twice", str(zero), ErrorCode.INVALID_REQUEST, "Duplicate topic name."),
            (
                "named",
                str(named_id),
                ErrorCode.INVALID_REQUEST,
                "The provided topic name maps to an ID that was already supplied.",
            ),
            ("named", str(named_id), ErrorCode.NONE, None),
            ("gone", gone_id, ErrorCode.NONE, None),
        ],
        key=lambda a: (a[0], a[1]),
    )
    assert [n for n in ("twice", "both", "named", "gone") if ctx.topics.get(n)] == ["twice", "both"]


async def test_a_created_topic_is_answered_with_every_config_in_effect(
    make_ctx: MakeContext,
) -> None:
    """As Kafka's controller answers CreateTopics (AdminClient's CreateTopicsResult.config):
    every topic config by name, with its value in effect and its source, what DescribeConfigs
    then says of the topic."""
    ctx = await make_ctx(**{"log.segment.bytes": str(2 << 20)})
    topic = new_topic("described")
    topic.configs = [
        CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(name=n, value=v)
        for n, v in (("cleanup.policy", "compact"), ("retention.ms", "60000"))
    ]
    for validate_only in (True, False):
        (result,) = await create_topics(ctx, topic, validate_only=validate_only)
        assert result.error_code == ErrorCode.NONE
        configs = {c.name: (c.value, c.config_source, c.read_only) for c in result.configs}
        assert [c.name for c in result.configs] == sorted(configs)
        assert configs["cleanup.policy"] == ("compact", 1, False)  # TOPIC_CONFIG
        assert configs["retention.ms"] == ("60000", 1, False)
        assert configs["segment.bytes"] == (str(2 << 20), 4, False)  # STATIC_BROKER_CONFIG
        assert configs["max.message.bytes"] == ("1048588", 5, False)  # DEFAULT_CONFIG
    described = {
        c["name"]: (c["value"], c["config_source"], c["read_only"])
        for c in describe_topic(ctx, ctx.topics.get("described"), False, False)
    }
    assert configs == described


async def test_append_to_a_list_the_topic_does_not_set_starts_from_the_schemas_default(
    make_ctx: MakeContext,
) -> None:
    """As Kafka's controller: IncrementalAlterConfigs APPEND on a topic list config the topic
    does not set starts from the topic schema's default (cleanup.policy ``delete``), not from
    the broker's (``log.cleanup.policy``); an item already there is not added twice."""
    ctx = await make_ctx(**{"log.cleanup.policy": "compact"})
    await ctx.topics.create("appended", 1, {})
    alterable = IncrementalAlterConfigsRequest.AlterConfigsResource.AlterableConfig
    request = IncrementalAlterConfigsRequest[1](
        resources=[
            IncrementalAlterConfigsRequest.AlterConfigsResource(
                resource_type=2,
                resource_name="appended",
                configs=[
                    alterable(name="cleanup.policy", config_operation=2, value="compact,compact")
                ],
            )
        ],
        validate_only=False,
    )
    (result,) = (await call(ctx, request, IncrementalAlterConfigsResponse)).responses
    assert result.error_code == ErrorCode.NONE, result.error_message
    assert ctx.topics.get("appended").configs == {"cleanup.policy": "delete,compact"}


async def test_a_resource_named_twice_is_altered_by_neither(ctx: BrokerContext) -> None:
    """As Kafka's ConfigAdminManager.preprocess: both rows of a resource given twice are
    INVALID_REQUEST and neither change is made; the other resources are altered."""
    await ctx.topics.create("twice", 1, {})
    await ctx.topics.create("once", 1, {})
    alterable = IncrementalAlterConfigsRequest.AlterConfigsResource.AlterableConfig

    def resource(name: str, value: str) -> Any:
        return IncrementalAlterConfigsRequest.AlterConfigsResource(
            resource_type=2,
            resource_name=name,
            configs=[alterable(name="retention.ms", config_operation=0, value=value)],
        )

    request = IncrementalAlterConfigsRequest[1](
        resources=[resource("twice", "1000"), resource("once", "2000"), resource("twice", "3000")],
        validate_only=False,
    )
    results = (await call(ctx, request, IncrementalAlterConfigsResponse)).responses
    assert [(r.resource_name, r.error_code, r.error_message) for r in results] == [
        ("twice", ErrorCode.INVALID_REQUEST, "Each resource must appear at most once."),
        ("once", ErrorCode.NONE, None),
        ("twice", ErrorCode.INVALID_REQUEST, "Each resource must appear at most once."),
    ]
    assert ctx.topics.get("twice").configs == {}
    assert ctx.topics.get("once").configs == {"retention.ms": "2000"}
