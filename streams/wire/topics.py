"""Topic names, keys, partitioning and retention: the market's wire layout in one place.

All input topics are keyed by ``stream_id`` and have the same partition count, so Faust assigns
a stream's registrations, values and purchases — and the table entries written while processing
them — to the same worker. Per-stream processing is therefore sequential, which is what makes the
cap check and the release states race-free without locks, and adding workers scales out by
stream.

=====================  ===========  ===========  ==============================================
topic                  key          partitions   retention / cleanup
=====================  ===========  ===========  ==============================================
<p>.registrations      stream_id    P            delete, 7 days (requests; the catalog is the
                                                 record)
<p>.catalog            stream_id    1            compact (latest accepted registration)
<p>.values             stream_id    P            delete, 7 days
<p>.purchases          stream_id    P            delete, 30 days (purchases and quotes)
<p>.buyer.<buyer_id>   purchase_id  1            delete, 365 days (a buyer's own releases,
                       / value_id                receipts, quotes and rejections)
<p>.rejections         stream_id    1            delete, 30 days (dead letters)
<p>.market             —            1            delete, forever (the market's identity: which
                                                 noise secret its state was made with)
<app>-<table>-changelog key         P            compact (Faust tables: state)
=====================  ===========  ===========  ==============================================

The embedded Tansu broker stores these configs but enforces neither retention nor compaction.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DAY_MS", "DEDUP_HORIZON_MS", "TopicSpec", "Topics"]

DAY_MS = 86_400_000
DEDUP_HORIZON_MS = 7 * DAY_MS
"""How long the market recognises a resent value or purchase (the dedup horizon).

It equals the retention of the registrations and values topics: anything older can no longer be
replayed from the broker, so its dedup markers may be forgotten. Workers take it as their
default (``EMARKET_DEDUP_HORIZON``); the events' timestamps are measured against it."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


@dataclass(frozen=True)
class Topics:
    """Names of the market's topics under ``prefix``."""

    prefix: str = "emarket"
    partitions: int = 4

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
    def identity(self) -> str:
        """Who made this market's state: the first record names the noise secret (kept forever)."""
        return f"{self.prefix}.market"

    def buyer(self, buyer_id: str) -> str:
        return f"{self.prefix}.buyer.{buyer_id}"

    def inputs(self) -> tuple[str, str, str]:
        return (self.registrations, self.values, self.purchases)

    def specs(self) -> list[TopicSpec]:
        """Topics created at start-up (buyer topics are created on first use)."""

        def delete(days: int) -> dict[str, str]:
            return {"cleanup.policy": "delete", "retention.ms": str(days * DAY_MS)}

        p = self.partitions
        horizon = DEDUP_HORIZON_MS // DAY_MS
        return [
            TopicSpec(self.registrations, p, delete(horizon)),
            TopicSpec(self.values, p, delete(horizon)),
            TopicSpec(self.purchases, p, delete(30)),
            TopicSpec(self.catalog, 1, {"cleanup.policy": "compact"}),
            TopicSpec(self.rejections, 1, delete(30)),
            TopicSpec(self.identity, 1, {"cleanup.policy": "delete", "retention.ms": "-1"}),
        ]

    def buyer_spec(self, buyer_id: str) -> TopicSpec:
        return TopicSpec(
            self.buyer(buyer_id), 1, {"cleanup.policy": "delete", "retention.ms": str(365 * DAY_MS)}
        )
