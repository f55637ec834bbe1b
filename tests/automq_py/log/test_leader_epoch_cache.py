"""The leader epoch cache follows Kafka's LeaderEpochFileCache."""

from __future__ import annotations

import pytest

from automq_py.log.leader_epoch_cache import LeaderEpochCache
from automq_py.log.meta_stream_record import LeaderEpochCheckpoint


def test_assign_appends_and_ignores_a_repeat() -> None:
    cache = LeaderEpochCache()
    assert cache.assign(0, 0)
    assert not cache.assign(0, 10)  # the latest epoch keeps its start
    assert cache.assign(2, 10)
    assert cache.entries == ((0, 0), (2, 10)) and cache.latest_epoch == 2
    assert LeaderEpochCheckpoint.decode(cache.checkpoint().encode()).entries == cache.entries


def test_assign_drops_contradicted_entries() -> None:
    cache = LeaderEpochCache(((0, 0), (2, 10), (3, 20)))
    assert cache.assign(3, 15)  # the same epoch at an earlier offset moves it back
    assert cache.entries == ((0, 0), (2, 10), (3, 15))
    assert cache.assign(1, 12)  # an older epoch drops every newer one
    assert cache.entries == ((0, 0), (1, 12))
    with pytest.raises(ValueError):
        cache.assign(-1, 0)


def test_truncate_from_start_moves_the_epoch_in_force() -> None:
    cache = LeaderEpochCache(((0, 0), (2, 10), (3, 20)))
    assert not cache.truncate_from_start(0)
    assert cache.truncate_from_start(15)
    assert cache.entries == ((2, 15), (3, 20))
    assert cache.truncate_from_start(20)
    assert cache.entries == ((3, 20),)


def test_end_offset_for_epoch() -> None:
    cache = LeaderEpochCache(((1, 0), (3, 10), (5, 20)))
    assert cache.end_offset_for(5, 30) == (5, 30)
    assert cache.end_offset_for(3, 30) == (3, 20)
    assert cache.end_offset_for(4, 30) == (3, 20)
    assert cache.end_offset_for(0, 30) == (0, 0)
    assert cache.end_offset_for(6, 30) == (-1, -1)
    assert LeaderEpochCache().end_offset_for(1, 30) == (-1, -1)
