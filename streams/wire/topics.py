"""Topic names, keys, partitioning and retention: the market's wire layout in one place.

All input topics have the same partition count. Registrations, values and purchases are keyed by
``stream_id``, so Faust assigns a stream's events — and the table entries written while
processing them — to the same worker: per-stream processing is sequential, which makes the cap
check and the release chains race-free without locks, and adding workers scales out by stream.
Account events are keyed by ``account_id``; every worker reads the accounts table's changelog to
verify signatures on any stream.

=========================  ===========  ===========  ==========================================
topic                      key          partitions   retention / cleanup (bytes per partition)
=========================  ===========  ===========  ==========================================
<p>.accounts               account_id   P            delete, 30 days, 1 GiB (requests; the
                                                     accounts table is the record)
<p>.registrations          stream_id    P            delete, 7 days, 1 GiB (the catalog is the
                                                     record)
<p>.catalog                stream_id    1            compact, 16 MiB segments (latest accepted
                                                     registration)
<p>.values                 stream_id    P            delete, 7 days (the dedup horizon), 4 GiB
<p>.purchases              stream_id    P            delete, 30 days, 1 GiB (purchases, quotes)
<p>.inbox.<account_id>     request id   1            delete, 365 days, 1 GiB (one party's
                                                     outcomes, releases, receipts, quotes,
                                                     rejections); created when the account is
                                                     opened (v1 inboxes)
<p>.inbox                  route        N            delete, 365 days, 8 GiB (v2 inboxes: every
                                                     account's records, sealed, §8.5)
<p>.rejections             stream_id    1            delete, 30 days, 256 MiB (every refusal,
                                                     operators)
<p>.deadletters            topic        1            delete, 30 days, 64 MiB (outputs refused
                                                     for good)
<p>.refusals               SHA-256 of   1            compact + delete, 1 day and 64 MiB (why
                           the event                 each refused event was refused: a code,
                                                     signed; public)
<p>.market                 —            1            delete, forever (the market's identity: which
                                                     noise secret its state was made with)
<app>-<table>-changelog    key          P            compact (Faust tables: state)
=========================  ===========  ===========  ==========================================

Each byte bound is ``retention.bytes``, with ``segment.bytes`` a quarter of it (at most 64 MiB):
Kafka deletes whole closed segments only, so a partition holds at most the bound and one
segment. Compacted topics are bounded by their keys (streams, accounts, partitions: each capped
by :class:`~streams.core.context.Limits`). ``<p>.market`` has no byte bound: its first record is
the market's identity, which no bound may delete, and the market writes no other.

Topic names are built, never parsed: ids match ``[A-Za-z0-9_-]{1,64}`` (no dots), so
``<p>.inbox.<id>`` is injective. The embedded Tansu broker stores the retention and cleanup
configs but enforces none of them: there the market bounds what strangers make it write
(:mod:`streams.core.refusal_budget`; docs/operations.md, "Bounds on the topics").

**Partition = murmur2(key) mod P**, Kafka's default partitioner (the Java client's, aiokafka's and
librdkafka's ``murmur2_random``; *not* librdkafka's own default, ``consistent_random``). The
market recomputes it from the id *in the payload* and applies an event only there: a table entry
lives in the changelog partition of the event that wrote it, so an event on a foreign partition
would write a second copy of an account or stream that another worker (or, after a rebalance,
the replica of every worker) might read instead of the real one. A proven sender's event found
elsewhere is moved, byte for byte, to its own partition; any other is refused
(``wrong_partition``; :mod:`streams.core.placement`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DAY_MS",
    "DEDUP_HORIZON_MS",
    "MIB",
    "REFUSALS_CONFIG",
    "TopicSpec",
    "Topics",
    "murmur2",
]

DAY_MS = 86_400_000
DEDUP_HORIZON_MS = 7 * DAY_MS
"""How long the market recognises a resent value or purchase (the dedup horizon).

It equals the retention of the registrations and values topics: anything older can no longer be
replayed from the broker, so its dedup markers may be forgotten. Workers take it as their
default (``EMARKET_DEDUP_HORIZON``); the events' timestamps are measured against it."""


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` (``org.apache.kafka.common.utils.Utils.murmur2``), as an
    unsigned 32-bit int: the hash every Kafka client's default partitioner uses for keys."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    n = len(data)
    h = (0x9747B28C ^ n) & mask
    for i in range(0, n - n % 4, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * m) & mask
        k = ((k ^ (k >> 24)) * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[n - n % 4 :]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * m) & mask
    h = ((h ^ (h >> 13)) * m) & mask
    return h ^ (h >> 15)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


MIB = 1024 * 1024


def _bytes(limit: int) -> dict[str, str]:
    """A partition's byte bound: ``retention.bytes``, and segments small enough for Kafka to
    delete (it deletes closed segments only: the default 1 GiB segment would outlive a smaller
    bound)."""
    return {"retention.bytes": str(limit), "segment.bytes": str(min(limit // 4, 64 * MIB))}


REFUSALS_CONFIG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": str(DAY_MS),
    **_bytes(64 * MIB),
}
"""``<p>.refusals``: a sender reads its refusal within seconds of sending, so a day is ample;
compaction keeps one record per refused byte string (a resend is refused under the same key),
and 64 MiB (about 140,000 refusals of at most 512 B) bounds it whatever the rate of refusals."""


def _delete(days: int, limit: int) -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(days * DAY_MS), **_bytes(limit)}


@dataclass(frozen=True)
class Topics:
    """Names of the market's topics under ``prefix``."""

    prefix: str = "emarket"
    partitions: int = 4
    inboxes: int = 1
    """1: a topic per account (``<p>.inbox.<id>``); 2: one partitioned topic (§8.5)."""
    inbox_partitions: int = 16
    """The partitions of ``<p>.inbox`` in a market with v2 inboxes."""

    @property
    def accounts(self) -> str:
        return f"{self.prefix}.accounts"

    @property
    def registrations(self) -> str:
        return f"{self.prefix}.registrations"

    @property
    def catalog(self) -> str:
        return f"{self.prefix}.catalog"

    @property
    def values(self) -> str:
        return f"{self.prefix}.values"

    @property
    def purchases(self) -> str:
        return f"{self.prefix}.purchases"

    @property
    def rejections(self) -> str:
        return f"{self.prefix}.rejections"

    @property
    def deadletters(self) -> str:
        return f"{self.prefix}.deadletters"

    @property
    def refusals(self) -> str:
        """Why each refused event was refused, keyed by the SHA-256 of its bytes (public)."""
        return f"{self.prefix}.refusals"

    @property
    def identity(self) -> str:
        """Who made this market's state: the first record names the noise secret (kept forever)."""
        return f"{self.prefix}.market"

    @property
    def shared_inbox(self) -> str:
        """The one inbox topic of a market with v2 inboxes (docs/protocol.md §8.5)."""
        return f"{self.prefix}.inbox"

    def inbox_account(self, topic: str) -> str | None:
        """The account of the v1 inbox name ``topic`` (ids have no dots: the name is
        injective), or None if it is none."""
        head = f"{self.prefix}.inbox."
        return topic[len(head) :] if topic.startswith(head) else None

    def inbox(self, account_id: str) -> str:
        """The topic where the market writes to one party (its only readable topic of its own)."""
        return f"{self.prefix}.inbox.{account_id}"

    def partition_of(self, key: str) -> int:
        """The input partition of events keyed by ``key`` (an account or stream id): Kafka's
        default partitioner, ``(murmur2(key) & 0x7fffffff) % partitions``."""
        return (murmur2(key.encode()) & 0x7FFFFFFF) % self.partitions

    def inputs(self) -> tuple[str, str, str, str]:
        return (self.accounts, self.registrations, self.values, self.purchases)

    def specs(self) -> list[TopicSpec]:
        """Topics created at start-up (inboxes are created when accounts are opened)."""
        p = self.partitions
        horizon = DEDUP_HORIZON_MS // DAY_MS
        return [
            TopicSpec(self.accounts, p, _delete(30, 1024 * MIB)),
            TopicSpec(self.registrations, p, _delete(horizon, 1024 * MIB)),
            TopicSpec(self.values, p, _delete(horizon, 4096 * MIB)),
            TopicSpec(self.purchases, p, _delete(30, 1024 * MIB)),
            self.catalog_spec(),
            TopicSpec(self.rejections, 1, _delete(30, 256 * MIB)),
            TopicSpec(self.deadletters, 1, _delete(30, 64 * MIB)),
            TopicSpec(self.refusals, 1, REFUSALS_CONFIG),
            TopicSpec(self.identity, 1, {"cleanup.policy": "delete", "retention.ms": "-1"}),
            *([self.shared_inbox_spec()] if self.inboxes == 2 else []),
        ]

    def shared_inbox_spec(self) -> TopicSpec:
        """``<p>.inbox`` (v2): every account's partition shares its bytes, so its bound is
        larger than a v1 inbox's."""
        return TopicSpec(self.shared_inbox, self.inbox_partitions, _delete(365, 8192 * MIB))

    def catalog_spec(self) -> TopicSpec:
        """How the catalog is created (at start-up, and again if it goes missing)."""
        return TopicSpec(
            self.catalog, 1, {"cleanup.policy": "compact", "segment.bytes": str(16 * MIB)}
        )

    def is_published(self, topic: str) -> bool:
        """Whether the market publishes ``topic`` from its own state (an inbox, the catalog)."""
        return topic == self.catalog or self.is_inbox(topic) or self._is_shared_inbox(topic)

    def _is_shared_inbox(self, topic: str) -> bool:
        return self.inboxes == 2 and topic == self.shared_inbox

    def published_spec(self, topic: str) -> TopicSpec | None:
        """The spec of ``topic`` if it is one the market publishes from its own state (an
        inbox or the catalog), which it makes again when it goes missing; else None."""
        if topic == self.catalog:
            return self.catalog_spec()
        if self._is_shared_inbox(topic):
            return self.shared_inbox_spec()
        return self.inbox_topic_spec(topic) if self.is_inbox(topic) else None

    def inbox_spec(self, account_id: str) -> TopicSpec:
        return self.inbox_topic_spec(self.inbox(account_id))

    def is_inbox(self, topic: str) -> bool:
        """Whether ``topic`` is an inbox of this market (its name only: no id is read back)."""
        return topic.startswith(f"{self.prefix}.inbox.")

    def inbox_topic_spec(self, topic: str) -> TopicSpec:
        """How the inbox named ``topic`` is created (the same for every account)."""
        if not self.is_inbox(topic):
            raise ValueError(f"{topic!r} is not an inbox of market {self.prefix!r}")
        return TopicSpec(topic, 1, _delete(365, 1024 * MIB))
