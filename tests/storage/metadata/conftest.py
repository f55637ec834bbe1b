from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from storage.metadata.manager import MetadataManager
from tests.storage.metadata.helpers import FakeClock
from tests.support.postgres import PostgresServer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgresql"])
async def manager(
    request: pytest.FixtureRequest, clock: FakeClock
) -> AsyncIterator[MetadataManager]:
    """The metadata controller over each backend: the same checks must hold on both."""
    if request.param == "sqlite":
        url = "sqlite://:memory:"
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = server.create_database()
    m = await MetadataManager.open(url, clock=clock)
    yield m
    await m.close()
