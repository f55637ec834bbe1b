"""A broker's session after it was away: heartbeats to a real PostgreSQL, the broker's view of
the metadata a stand-in that shows what was committed only once it catches up."""

from __future__ import annotations

import time
from typing import Any, cast

from automq_py.broker_lifecycle import BrokerLifecycle
from automq_py.controller.cluster_records import BrokerRegistration

NODE = 7
INCARNATION = 3


class LaggingImage:
    """What the controller committed (``fenced``) and what this broker has applied of it."""

    def __init__(self) -> None:
        self.committed_fenced = False
        self.applied_fenced = False

    async def catch_up(self) -> None:
        self.applied_fenced = self.committed_fenced

    def broker(self, node_id: int) -> BrokerRegistration | None:
        assert node_id == NODE
        return BrokerRegistration(NODE, INCARNATION, "127.0.0.1", 9092, fenced=self.applied_fenced)


class Storage:
    def __init__(self, metadata: LaggingImage) -> None:
        self.metadata = metadata


def lifecycle(url: str, image: LaggingImage) -> BrokerLifecycle:
    return BrokerLifecycle(
        BrokerRegistration(NODE, INCARNATION, "127.0.0.1", 9092),
        url,
        cast(Any, Storage(image)),
        cast(Any, image),
        cast(Any, None),
        heartbeat_interval_ms=200,
        session_timeout_ms=1000,
    )


async def test_a_broker_back_from_a_freeze_sees_its_fence_before_its_session_counts(
    postgres_url: str,
) -> None:
    """Frozen past its session, the broker was fenced; its first heartbeat after goes through
    (the table takes any beat) while its image does not show the fence yet. The session must
    not count again (which would release held acknowledgements as written) before the fence
    is seen."""
    image = LaggingImage()
    broker = lifecycle(postgres_url, image)
    try:
        await broker._beat()
        assert broker.in_session() and not broker.fenced
        broker._last_beat = time.monotonic() - 5  # frozen for five seconds
        image.committed_fenced = True  # meanwhile the controller fenced this incarnation
        assert not broker.in_session()
        await broker._beat()
        assert broker.fenced, "the session counts again while the fence is not seen"
    finally:
        await broker._sender.close()


async def test_a_heartbeat_that_lands_after_the_session_ran_out_catches_up_first(
    postgres_url: str,
) -> None:
    """The heartbeat was sent in session but took until after it ran out to land (the
    connection to the database held up): the controller may have fenced this broker before it
    landed, so the session counts again only once that is seen."""
    image = LaggingImage()
    broker = lifecycle(postgres_url, image)
    try:
        await broker._beat()
        beat = broker._sender.beat

        async def held_up(incarnation: int) -> None:
            broker._last_beat = time.monotonic() - 5  # the session ran out meanwhile
            image.committed_fenced = True  # and the controller fenced this incarnation
            await beat(incarnation)

        broker._sender.beat = held_up  # type: ignore[method-assign]
        await broker._beat()
        assert broker.fenced, "the session counts again while the fence is not seen"
    finally:
        await broker._sender.close()


async def test_a_broker_in_session_beats_without_reading_the_metadata(postgres_url: str) -> None:
    """The catch-up is for a broker back from a lapse only: a heartbeat in session costs one
    statement."""
    image = LaggingImage()
    broker = lifecycle(postgres_url, image)
    try:
        await broker._beat()
        image.committed_fenced = True
        await broker._beat()
        assert broker.in_session() and not broker.fenced  # (not caught up: not asked to)
    finally:
        await broker._sender.close()
