"""A broker's session after it was away: heartbeats to a real PostgreSQL, the broker's view of
the metadata a stand-in that shows what was committed only once it catches up."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from automq_py.broker_lifecycle import BrokerLifecycle
from automq_py.controller.cluster_records import BrokerRegistration
from automq_py.metadata_cache import ClusterMetadataCache
from storage.config import S3StreamConfig
from storage.s3_storage import S3Storage
from storage.wal.errors import WALError
from tests.storage.conftest import storage_properties

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


async def test_a_broker_whose_wal_a_failover_took_over_does_not_rejoin(
    tmp_path: Path, postgres_url: str
) -> None:
    """Fenced long enough for the controller to recover its WAL in objects (a failover's node
    epoch, an epoch record fencing what this process writes there from then on), the broker
    must not register again with the WAL it still has open: what it acknowledged from then
    on would be lost with its next crash. Its storage fails (restart it); a broker whose WAL
    nobody took over rejoins as before."""
    properties = storage_properties(
        tmp_path, f"file://{tmp_path}/objects", **{"metadata.store.url": postgres_url}
    )
    storage = await S3Storage.start(S3StreamConfig.from_properties(properties))
    try:
        await _rejoin_unless_taken_over(storage, postgres_url)
    finally:
        await storage.close()


async def _rejoin_unless_taken_over(storage: S3Storage, postgres_url: str) -> None:
    metadata = storage.metadata
    node = storage.config.node_id

    def member() -> BrokerLifecycle:
        return BrokerLifecycle(
            BrokerRegistration(node, storage.node_epoch, "127.0.0.1", 9092),
            postgres_url,
            storage,
            ClusterMetadataCache(node, metadata),
            cast(Any, None),
            heartbeat_interval_ms=200,
            session_timeout_ms=1000,
        )

    async def fence() -> int:
        """The controller's fence moves the node epoch on by one, as a failover (whose
        recovery of an object WAL then takes it one further)."""
        return await metadata.register_node(node, replacing=metadata.image.nodes[node].epoch)

    rejoined = member()
    try:
        before = storage.node_epoch
        assert await fence() == before + 1  # fenced; nobody recovered its WAL
        await rejoined._rejoin()
        assert storage.failed is None and storage.node_epoch == before + 2
        assert not metadata.image.nodes[node].failover
    finally:
        await rejoined._sender.close()

    taken_over = member()
    try:
        await fence()
        await fence()  # the recovery's, after the fence's
        failover_epoch = metadata.image.nodes[node].epoch
        await taken_over._rejoin()
        assert isinstance(storage.failed, WALError), storage.failed
        assert "restart the broker" in str(storage.failed)
        assert metadata.image.nodes[node].epoch == failover_epoch  # no new epoch of its own
    finally:
        await taken_over._sender.close()
