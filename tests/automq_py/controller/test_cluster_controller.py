"""The controller role over a real PostgreSQL: what the lease holder does when it cannot act."""

from __future__ import annotations

import asyncio

from automq_py.controller.cluster_controller import ClusterController
from automq_py.controller.liveness import ControllerLease
from automq_py.metadata_cache import ClusterMetadataCache
from storage.metadata.manager import MetadataManager
from tests.storage.metadata.helpers import NEWER_VERSION_ENTRY, append_raw


async def test_a_controller_whose_metadata_stopped_following_gives_the_lease_up(
    postgres_url: str,
) -> None:
    """Its image frozen at an entry it cannot read, the controller can commit no fence and no
    move: held on, the lease would leave the cluster without a controller that acts. It is
    released, so another broker takes it at once rather than after it runs out."""
    metadata = await MetadataManager.open(postgres_url)
    controller = ClusterController(
        1,
        postgres_url,
        metadata,
        ClusterMetadataCache(1, metadata),
        heartbeat_interval_ms=100,
        session_timeout_ms=60_000,
    )
    other = ControllerLease(postgres_url, 2, lease_ms=60_000, margin_ms=100)
    try:
        await controller._round()
        assert controller.active
        assert not await other.acquire_or_renew()
        await append_raw(postgres_url, NEWER_VERSION_ENTRY)
        async with asyncio.timeout(5):
            while metadata.failed is None:
                await asyncio.sleep(0.01)
        await controller._round()
        assert not controller.active
        assert await other.acquire_or_renew()  # at once: the lease had 60 s left
        await controller._round()  # nor does it take the lease again
        assert not controller.active
        assert await other.holder() == (2, other.epoch)
    finally:
        await controller.stop()
        await other.close()
        await metadata.close()
