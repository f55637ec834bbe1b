"""The topic registry of two brokers over one PostgreSQL metadata log: a change made through
one from what it read keeps what the other changed meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from automq_py.topics import TopicError, TopicRegistry, check_partition_count, validate_name
from protocol.errors import ErrorCode
from storage.metadata.manager import MetadataManager


@pytest.fixture
async def registries(postgres_url: str) -> AsyncIterator[tuple[TopicRegistry, TopicRegistry]]:
    a = await MetadataManager.open(postgres_url)
    b = await MetadataManager.open(postgres_url)
    yield TopicRegistry(a), TopicRegistry(b)
    await a.close()
    await b.close()


async def _eventually(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not check():
            await asyncio.sleep(0.005)


async def test_a_config_change_keeps_the_partitions_another_broker_added(
    registries: tuple[TopicRegistry, TopicRegistry],
) -> None:
    a, b = registries
    await a.create("t", 3, {"retention.ms": "1000"})
    await _eventually(lambda: b.get("t") is not None)
    read_by_b = b.get("t")  # an AlterConfigs reaches b and reads the topic...
    assert read_by_b is not None
    await a.update(a.get("t"), partitions=6)  # type: ignore[arg-type]  # ...a adds partitions
    updated = await b.update(read_by_b, configs={"retention.ms": "2000"})
    assert updated.partitions == 6
    await _eventually(lambda: (t := a.get("t")) is not None and t.configs["retention.ms"] == "2000")
    assert a.get("t") == b.get("t") == updated


async def test_config_changes_of_different_keys_through_two_brokers_are_both_kept(
    registries: tuple[TopicRegistry, TopicRegistry],
) -> None:
    a, b = registries
    await a.create("t", 1, {"retention.ms": "1000", "cleanup.policy": "delete"})
    await _eventually(lambda: b.get("t") is not None)
    read_by_a, read_by_b = a.get("t"), b.get("t")
    assert read_by_a is not None and read_by_b is not None
    # each sends the whole set it made from what it read: one key changed, one deleted
    await a.update(read_by_a, configs={"retention.ms": "2000", "cleanup.policy": "delete"})
    updated = await b.update(read_by_b, configs={"retention.ms": "1000"})
    assert updated.configs == {"retention.ms": "2000"}


async def test_partitions_added_through_two_brokers_at_once_are_added_once(
    registries: tuple[TopicRegistry, TopicRegistry],
) -> None:
    a, b = registries
    await a.create("t", 3)
    await _eventually(lambda: b.get("t") is not None)
    read_by_a, read_by_b = a.get("t"), b.get("t")
    assert read_by_a is not None and read_by_b is not None
    await a.update(read_by_a, partitions=6)
    with pytest.raises(TopicError, match=r"^Topic already has 6 partition\(s\)\.$") as refused:
        await b.update(read_by_b, partitions=6)
    assert refused.value.code == ErrorCode.INVALID_PARTITIONS
    with pytest.raises(
        TopicError, match=r"currently has 6 partition\(s\); 5 would not be an increase\."
    ):
        await b.update(read_by_b, partitions=5)  # would have removed one


async def test_a_change_to_a_topic_deleted_meanwhile_is_refused_not_recreated(
    registries: tuple[TopicRegistry, TopicRegistry],
) -> None:
    a, b = registries
    await a.create("t", 1)
    await _eventually(lambda: b.get("t") is not None)
    read_by_b = b.get("t")
    assert read_by_b is not None
    await a.delete("t")
    with pytest.raises(TopicError) as refused:
        await b.update(read_by_b, configs={"retention.ms": "5"})
    assert refused.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    await a.create("t", 2)  # the same name again: a new topic id
    with pytest.raises(TopicError) as refused:
        await b.update(read_by_b, configs={"retention.ms": "5"})
    assert refused.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    await _eventually(lambda: (t := b.get("t")) is not None and t.partitions == 2)
    assert a.get("t") == b.get("t")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "Topic name is illegal, it can't be empty"),
        ("..", 'Topic name cannot be "." or ".."'),
        (
            "t" * 250,
            "Topic name is illegal, it can't be longer than 249 characters, Topic name: "
            + "t" * 250,
        ),
        (
            "no spaces",
            'Topic name "no spaces" is illegal, it contains a character other than ASCII '
            "alphanumerics, '.', '_' and '-'",
        ),
    ],
)
def test_an_illegal_name_is_refused_in_kafkas_words(name: str, message: str) -> None:
    """Kafka's Topic.validate messages, which kafka-topics prints as they are."""
    with pytest.raises(TopicError) as refused:
        validate_name(name)
    assert (refused.value.code, str(refused.value)) == (ErrorCode.INVALID_TOPIC_EXCEPTION, message)
    validate_name("a.legal_Name-1")


def test_a_partition_count_below_one_is_refused_in_kafkas_words() -> None:
    for count in (0, -2):
        with pytest.raises(TopicError) as refused:
            check_partition_count(count)
        assert (refused.value.code, str(refused.value)) == (
            ErrorCode.INVALID_PARTITIONS,
            "Number of partitions was set to an invalid non-positive value.",
        )
