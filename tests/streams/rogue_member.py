"""A stranger in the workers' consumer group: a plain aiokafka consumer, as issue #39's red team
ran it.

It joins the group whose id is the market's app id under Faust's assignor name (``faust``,
version 4) with well-formed metadata, a Faust ``ClientMetadata`` like a worker's, but without
the market's key it can prove nothing. As a follower it takes what the leader gives it; elected
leader (it started first, in a fresh group) it gives itself partition 0 of every input topic
and every other member the other partitions of what it subscribed, in the form Faust's
``on_assignment`` accepts, so that the workers keep running under it. It never reads a record:
holding the partitions is the attack.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata

__all__ = ["RogueMember", "faust_like_metadata"]

ROGUE_URL = "http://127.0.0.1:1"


def faust_like_metadata(url: str = ROGUE_URL) -> bytes:
    """The JSON a Faust worker sends as its JoinGroup user data, with no assignment yet."""
    empty = ClientAssignment(actives={}, standbys={})
    meta = ClientMetadata(
        assignment=empty,
        url=url,
        changelog_distribution={},
        external_topic_distribution={},
        topic_groups={},
    )
    return bytes(meta.dumps())


def member_url(meta: Any) -> str:
    """The web URL a member's Faust metadata names; a member without one is a rogue."""
    try:
        return str(json.loads(meta.user_data)["url"])
    except (ValueError, KeyError, TypeError):
        return ROGUE_URL


def _faust_assignment(url: str, actives: dict[str, list[int]]) -> ConsumerProtocolMemberAssignment:
    """What Faust's ``on_assignment`` accepts: the partitions, and the same as a Faust
    ``ClientMetadata`` (zlib-compressed JSON) naming the member's own URL."""
    meta = ClientMetadata(
        assignment=ClientAssignment(actives=actives, standbys={}),
        url=url,
        changelog_distribution={url: actives},
        external_topic_distribution={},
        topic_groups={},
    )
    return ConsumerProtocolMemberAssignment(
        4, sorted(actives.items()), zlib.compress(bytes(meta.dumps()))
    )


class RogueMember:
    """One rogue consumer in group ``group``, subscribed to ``inputs``."""

    def __init__(self, bootstrap: str, group: str, inputs: Sequence[str]) -> None:
        self.inputs = list(inputs)
        self.assignments: list[set[TopicPartition]] = []
        self.led = 0  # assignments it made as the group's leader
        rogue = self

        class Assignor(AbstractPartitionAssignor):
            name = "faust"  # Faust's assignor name: the workers' group protocol
            version = 4

            @classmethod
            def metadata(cls, topics: set[str]) -> ConsumerProtocolMemberMetadata:
                return ConsumerProtocolMemberMetadata(4, sorted(topics), faust_like_metadata())

            @classmethod
            def assign(cls, cluster: Any, members: Mapping[str, Any]) -> dict[str, Any]:
                rogue.led += 1
                return rogue.assign(cluster, members)

            @classmethod
            def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
                rogue.assignments.append(
                    {TopicPartition(t, p) for t, ps in assignment.assignment for p in ps}
                )

        self._config = {
            "bootstrap_servers": bootstrap,
            "group_id": group,
            "session_timeout_ms": 3000,
            "heartbeat_interval_ms": 300,
            "enable_auto_commit": False,
            "partition_assignment_strategy": (Assignor,),
        }
        self.consumer: AIOKafkaConsumer | None = None

    def assign(self, cluster: Any, members: Mapping[str, Any]) -> dict[str, Any]:
        """Partition 0 of every input topic to itself; to every other member, the partitions
        but 0 of each topic it subscribed (Faust's shape: a worker holds a changelog's
        partition with the input partition of the same number)."""
        mine = {t: [0] for t in self.inputs}
        out: dict[str, Any] = {}
        for member, meta in members.items():
            url = member_url(meta)
            if url == ROGUE_URL:
                out[member] = _faust_assignment(url, mine)
                continue
            actives = {
                t: [p for p in sorted(cluster.partitions_for_topic(t) or ()) if p != 0]
                for t in sorted(meta.subscription)
            }
            out[member] = _faust_assignment(url, {t: ps for t, ps in actives.items() if ps})
        return out

    async def start(self) -> None:
        """Join the group (aiokafka's consumer is made in the running loop)."""
        self.consumer = AIOKafkaConsumer(*self.inputs, **self._config)
        await self.consumer.start()

    async def stop(self) -> None:
        """Leave the group (aiokafka sends LeaveGroup)."""
        if self.consumer is not None:
            await self.consumer.stop()

    def held(self) -> set[TopicPartition]:
        """Its current partitions (what the group's last assignment gave it)."""
        return set(self.consumer.assignment()) if self.consumer is not None else set()

    async def wait_assigned(self, timeout: float = 90.0) -> set[TopicPartition]:
        """Wait for its first assignment (an empty one counts); return what it holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.assignments:
            if loop.time() > deadline:
                raise TimeoutError(f"the rogue was given no assignment within {timeout}s")
            await asyncio.sleep(0.2)
        return self.held()
