from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from storage.metadata.manager import MetadataManager
from tests.storage.metadata.helpers import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def manager(clock: FakeClock) -> AsyncIterator[MetadataManager]:
    m = await MetadataManager.open("sqlite://:memory:", clock=clock)
    yield m
    await m.close()
