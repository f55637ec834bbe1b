"""Leaders of new partitions, decided inside the metadata change that creates them.

Any broker may create a topic (CreateTopics, auto-creation, a coordinator's internal topic): the
change that adds the topic also sets its partitions' leaders, placed by
:func:`automq_py.controller.placement.place_new_partitions` over the live brokers. The change is
checked against the latest image, so two brokers creating topics at once both place against the
state the other left.
"""

from __future__ import annotations

from collections.abc import Sequence

from automq_py.controller import membership
from automq_py.controller.placement import live_brokers, place_new_partitions
from automq_py.metadata_cache import ClusterMetadataCache
from automq_py.topics import TopicError
from protocol.errors import ErrorCode
from storage.metadata.image import MetadataImage
from storage.metadata.records import Record


class ClusterTopicPlacement:
    """:class:`automq_py.topics.LeaderPlacement` for a cluster."""

    def __init__(self, cache: ClusterMetadataCache) -> None:
        # the cache follows the image the change is checked against: the manager applies
        # records and tells its listeners before it plans the next change
        self._cache = cache

    def new_partitions(
        self,
        image: MetadataImage,
        topic: str,
        count: int,
        first_index: int,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> list[Record]:
        """The records of ``count`` new partitions' leaders: placed, or with a manual
        ``assignments`` each led by the first live broker of its list, as Kafka's controller
        makes it the leader (INVALID_REPLICA_ASSIGNMENT when none of the list is live)."""
        brokers = list(membership.brokers(image).values())
        if assignments is None:
            current = self._cache.all_leaders()
            leaders = place_new_partitions(brokers, current, topic, count, first_index)
        else:
            live = {b.node_id for b in live_brokers(brokers)}
            leaders = []
            for index, replicas in enumerate(assignments, first_index):
                leader = next((n for n in replicas if n in live), None)
                if leader is None:
                    raise TopicError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"All brokers specified in the manual partition assignment for "
                        f"partition {index} are fenced or in controlled shutdown.",
                    )
                leaders.append(leader)
        if first_index == 0:
            return membership.set_new_topic_leaders(topic, leaders)
        return membership.add_partition_leaders(image, topic, leaders)

    def dropped(self, image: MetadataImage, topic: str) -> list[Record]:
        return membership.drop_topic_leaders(image, topic)
