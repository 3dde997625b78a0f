"""Prometheus metrics of a worker, built on an injected registry (never the global one).

Names follow ``namespace_subsystem_name_unit``; labels are closed sets (mechanism, outcome,
reason, table) except ``stream``, which is bounded by the operator-controlled catalog and is what
the privacy and revenue ledgers are about.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from ..core.outputs import Outcome
from ..core.refusal_budget import DROP_CAUSES
from ..core.state import Stores
from .history import PROGRESS
from .membership import REFUSALS

__all__ = [
    "DEAD_LETTER_KINDS",
    "REFUSED_REASONS",
    "TOPIC_KINDS",
    "Metrics",
    "build_metrics",
    "dead_letter_kind",
]

NS = "emarket"
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass
class Metrics:
    """The worker's metrics, and the two facts /health reads (never from a gauge's internals)."""

    registry: CollectorRegistry
    values: Counter
    purchases: Counter
    quotes: Counter
    reservations: Counter
    reservations_held: Gauge
    forwarded: Counter
    registrations: Counter
    accounts: Counter
    releases: Counter
    noise_draws: Counter
    rejections: Counter
    refusals_dropped: Counter
    dead_letters: Counter
    state_refused: Counter
    state_copies: Counter
    state_uncommitted: Counter
    partitions_unverified: Gauge
    replica_accounts: Gauge
    offsets_ahead: Counter
    purchase_latency: Histogram
    batch_size: Histogram
    privacy_spent: Gauge
    privacy_cap: Gauge
    window_spent: Gauge
    window_headroom: Gauge
    window_cap: Gauge
    withheld: Counter
    quota_refusals: Counter
    revenue: Counter
    state_entries: Gauge
    state_bytes: Gauge
    consumer_lag: Gauge
    broker_up: Gauge
    stalled: Gauge
    last_batch: Gauge
    inboxes_waiting: Gauge
    openings_behind: Gauge
    group_refused: Counter
    group_untrusted: Gauge
    group_unproven_partitions: Gauge
    group_unproven_members: Gauge
    topics_recreated: Counter
    catalog_republished: Counter
    page_builds: Counter
    broker_is_up: bool = field(default=False, init=False)
    last_batch_at: float | None = field(default=None, init=False)
    batch_started_at: float | None = field(default=None, init=False)
    _counts: dict[tuple[Counter, tuple[str, ...]], float] = field(
        default_factory=dict, init=False, repr=False
    )
    _gauges: dict[tuple[Gauge, tuple[str, ...]], float] = field(
        default_factory=dict, init=False, repr=False
    )

    def record(self, o: Outcome) -> None:
        """Count one event's outcome: held until :meth:`flush` (once per batch).

        A batch's events share a few label sets (a purchase's status, its stream's ledger):
        adding them up in a dict and updating each child once per batch saves most of the
        per-event ``labels()`` lookups and locks of prometheus-client.
        """
        inc = self._inc
        if o.status == "forwarded":  # counted once more where it lands, by its outcome there
            inc(self.forwarded, (o.kind,))
            return
        # one refusal counts once: a value batch's refusals are its values' (a batch whose
        # values are all refused is "rejected" too, with the first value's reason); an event
        # refused as a whole has no items
        if o.status == "rejected" and not o.items:
            inc(self.rejections, (o.reason or "unknown",))
        if o.dropped:
            inc(self.refusals_dropped, (o.dropped,))
        mech = o.mechanism or "unknown"
        for status, reason in o.items:  # the values of a batch, one by one
            inc(self.values, (mech, status))
            if reason:
                inc(self.rejections, (reason,))
        self._by_kind(o, mech)
        if o.new_noise:
            inc(self.noise_draws, (mech,), o.new_noise)
        self._ledger(o)

    def _by_kind(self, o: Outcome, mech: str) -> None:
        """The counter of the event's kind (a value's, a purchase's, ...)."""
        inc = self._inc
        replay = o.status == "duplicate"
        if o.kind == "value":
            if not o.items:  # refused as a whole (bad signature, unknown stream, ...)
                inc(self.values, (mech, o.status))
            inc(self.releases, ("replay" if replay else "subscription",), o.releases)
        elif o.kind == "purchase":
            inc(self.purchases, (o.status,))
            inc(self.releases, ("replay" if replay else "purchase",), o.releases)
        elif o.kind == "quote":
            inc(self.quotes, (), 1)
        elif o.kind == "reserve":
            inc(self.reservations, (o.status,))
        elif o.kind == "registration":
            inc(self.registrations, (o.status,))
        elif o.kind == "account":
            inc(self.accounts, (o.status,))

    def _inc(self, metric: Counter, labels: tuple[str, ...], amount: float = 1) -> None:
        key = (metric, labels)
        self._counts[key] = self._counts.get(key, 0) + amount

    def _ledger(self, o: Outcome) -> None:
        """The stream's privacy and revenue figures after the event."""
        if o.withheld and o.stream_id:
            self._inc(self.withheld, (o.stream_id,), o.withheld)
        if o.quota_withheld and o.stream_id:
            self._inc(self.quota_refusals, (o.stream_id, "delivery"), o.quota_withheld)
        if o.reason == "buyer_quota_exceeded" and o.status == "rejected" and o.stream_id:
            self._inc(self.quota_refusals, (o.stream_id, "purchase"))
        f = o.figures
        if f is None:
            return
        labels = (f.stream_id, f.mechanism, f.level_unit)
        gauges = self._gauges
        gauges[self.privacy_spent, labels] = f.spent
        gauges[self.privacy_cap, labels] = f.cap
        gauges[self.reservations_held, (f.stream_id,)] = f.reservations_held
        if (
            f.window_cap is not None
            and f.window_spent is not None
            and f.window_headroom is not None
        ):
            for gauge, value in (
                (self.window_spent, f.window_spent),
                (self.window_cap, f.window_cap),
                (self.window_headroom, f.window_headroom),
            ):
                gauges[gauge, labels] = value
        if o.price_minor > 0:
            self._inc(self.revenue, (f.stream_id, f.currency), o.price_minor)

    def flush(self) -> None:
        """Apply what :meth:`record` held: each counter child incremented once, each gauge set
        to the last value the batch gave it (the worker calls this before a batch's outputs
        are sent, so whoever sees an output sees it counted)."""
        counts, gauges = self._counts, self._gauges
        self._counts, self._gauges = {}, {}
        for (metric, labels), amount in counts.items():
            if amount:
                (metric.labels(*labels) if labels else metric).inc(amount)
        for (gauge, labels), value in gauges.items():
            gauge.labels(*labels).set(value)

    def set_broker_up(self, ok: bool) -> bool:
        """Record whether the broker answered; return True when that changed."""
        changed = ok != self.broker_is_up
        self.broker_is_up = ok
        self.broker_up.set(1 if ok else 0)
        return changed

    def batch_started(self) -> None:
        self.batch_started_at = time.time()

    def batch_done(self, now: float | None = None) -> None:
        self.batch_started_at = None
        self.last_batch_at = time.time() if now is None else now
        self.last_batch.set(self.last_batch_at)


_UNITS = ["stream", "mechanism", "unit"]

# attribute: (type, name, help, labels, extra keyword arguments)
_SPECS: dict[str, tuple[Any, str, str, list[str], dict[str, Any]]] = {
    "values": (
        Counter,
        "values_ingested",
        "Seller values processed, by outcome",
        ["mechanism", "status"],
        {},
    ),
    "purchases": (
        Counter,
        "purchases",
        "Purchases processed, by outcome (fulfilled, rejected, duplicate)",
        ["outcome"],
        {},
    ),
    "quotes": (Counter, "quotes", "Quote requests answered", [], {}),
    "reservations": (
        Counter,
        "reservations",
        "Reservation requests, by outcome (accepted, rejected, duplicate)",
        ["outcome"],
        {},
    ),
    "reservations_held": (
        Gauge,
        "reservations_held",
        "Reservations holding a purchase's terms and privacy room on the stream now",
        ["stream"],
        {},
    ),
    "registrations": (
        Counter,
        "registrations",
        "Stream registrations, by outcome",
        ["outcome"],
        {},
    ),
    "accounts": (
        Counter,
        "account_events",
        "Accounts opened and keys rotated, by outcome",
        ["outcome"],
        {},
    ),
    "releases": (
        Counter,
        "releases",
        "Noisy vectors sent to buyers (kind: purchase, subscription, replay)",
        ["kind"],
        {},
    ),
    "noise_draws": (
        Counter,
        "noise_draws",
        "New privacy levels sampled (fresh noise); replays never add here",
        ["mechanism"],
        {},
    ),
    "rejections": (
        Counter,
        "rejections",
        "Events refused (to the rejections topic), by reason",
        ["reason"],
        {},
    ),
    "refusals_dropped": (
        Counter,
        "refusals_dropped",
        "Refusals of events no account was proven to send that were counted, "
        "not written (cause: repeated, the same bytes answered already; "
        "over_bound, the partition's answers of the interval at their bound); "
        "each interval's are summed up in one refusals_dropped rejection",
        ["cause"],
        {},
    ),
    "forwarded": (
        Counter,
        "events_forwarded",
        "Events a producer wrote to another input partition than their id's, moved "
        "to their own (kind: account, registration, value, purchase, quote, reserve)",
        ["kind"],
        {},
    ),
    "dead_letters": (
        Counter,
        "dead_letters",
        "Outputs the broker refused for good (to <p>.deadletters), by kind of "
        "error (too_large, unauthorized, unknown_topic, other)",
        ["reason"],
        {},
    ),
    "state_refused": (
        Counter,
        "state_records_refused",
        "Changelog records read back (table recovery, account replica) refused, "
        "never applied, by store and reason: forged (no valid seal), moved "
        "(another partition's), older (a record appended again after a newer "
        "one: a rollback), checkpoint (an older checkpoint), foreign (appended to "
        "a partition this worker writes)",
        ["store", "reason"],
        {},
    ),
    "state_copies": (
        Counter,
        "state_records_copies",
        "Changelog records read back that repeat the version already held (a "
        "producer's retry, or a copy someone appended): changed nothing",
        ["store"],
        {},
    ),
    "state_uncommitted": (
        Counter,
        "state_records_uncommitted",
        "Changelog records of batches lost before their checkpoint: never applied",
        ["store"],
        {},
    ),
    "partitions_unverified": (
        Gauge,
        "partitions_unverified",
        "Partitions whose state read back is not what their checkpoint "
        "commits, by reader: tables (assigned here: not served), replica "
        "(their accounts not used)",
        ["reader"],
        {},
    ),
    "replica_accounts": (
        Gauge,
        "replica_accounts",
        "Accounts the account replica holds: every account of the market, each partition's "
        "as its checkpoints commit them",
        [],
        {},
    ),
    "offsets_ahead": (
        Counter,
        "offsets_ahead",
        "Consumer-group offsets found ahead of the position this worker's state "
        "proves (committed by someone else): ignored, the events processed; by "
        "input (accounts, registrations, values, purchases)",
        ["input"],
        {},
    ),
    "purchase_latency": (
        Histogram,
        "purchase_latency_seconds",
        "Time from a purchase's broker timestamp to its outcome being acknowledged",
        [],
        {"buckets": LATENCY_BUCKETS},
    ),
    "batch_size": (
        Histogram,
        "batch_events",
        "Events processed per batch",
        [],
        {"buckets": (1, 2, 5, 10, 20, 50, 100, 200, 500)},
    ),
    "privacy_spent": (
        Gauge,
        "privacy_spent",
        "Largest privacy level ever released on the stream (its loss), in the "
        "unit label (epsilon, rho or omega)",
        _UNITS,
        {},
    ),
    "privacy_cap": (
        Gauge,
        "privacy_cap",
        "Cap the seller set on the stream, in the unit label",
        _UNITS,
        {},
    ),
    "window_spent": (
        Gauge,
        "privacy_window_spent",
        "On a 'window' stream: sum over the values of its newest value's privacy "
        "window of each value's largest level released, in the unit label",
        _UNITS,
        {},
    ),
    "window_headroom": (
        Gauge,
        "privacy_window_headroom",
        "On a 'window' stream: window cap minus spent, for the window of its "
        "newest value, in the unit label",
        _UNITS,
        {},
    ),
    "window_cap": (
        Gauge,
        "privacy_window_cap",
        "On a 'window' stream: most the values of one window may spend together, in the unit label",
        _UNITS,
        {},
    ),
    "withheld": (
        Counter,
        "deliveries_withheld",
        "Subscription deliveries withheld because a privacy window (or a buyer's share of it) was "
        "full",
        ["stream"],
        {},
    ),
    "quota_refusals": (
        Counter,
        "buyer_quota_refusals",
        "Purchases refused and subscription deliveries withheld because they would exceed one "
        "buyer's share of the stream's caps (kind: purchase or delivery)",
        ["stream", "kind"],
        {},
    ),
    "revenue": (
        Counter,
        "revenue_minor",
        "Revenue in minor currency units",
        ["stream", "currency"],
        {},
    ),
    "state_entries": (
        Gauge,
        "state_entries",
        "Entries held in each table on this worker",
        ["table"],
        {},
    ),
    "state_bytes": (
        Gauge,
        "state_vector_bytes",
        "Bytes of release vectors held on this worker",
        [],
        {},
    ),
    "consumer_lag": (
        Gauge,
        "consumer_lag_messages",
        "Messages not yet processed on this worker's input partitions",
        ["topic"],
        {},
    ),
    "broker_up": (
        Gauge,
        "broker_up",
        "1 when the last broker round trip succeeded, else 0",
        [],
        {},
    ),
    "stalled": (
        Gauge,
        "stalled",
        "1 while input waits and no batch completes (or one batch runs) for "
        "EMARKET_STALL_SECONDS, as /health reports 'stalled'; else 0",
        [],
        {},
    ),
    "last_batch": (
        Gauge,
        "last_batch_timestamp_seconds",
        "Unix time of the last processed batch",
        [],
        {},
    ),
    "inboxes_waiting": (
        Gauge,
        "inboxes_waiting",
        "Inbox topics (or the catalog) queued for creation, their outputs held "
        "(new accounts, or topics found gone and made again)",
        [],
        {},
    ),
    "openings_behind": (
        Gauge,
        "openings_behind",
        "1 while account openings fall behind, as /health's openings.behind "
        "says: an opening was refused rate_limited within the last minute, or "
        "more inbox topics wait for creation than one request makes; else 0",
        [],
        {},
    ),
    "group_refused": (
        Counter,
        "group_members_refused",
        "Members of the workers' consumer group this worker, as its leader, gave "
        "nothing: they did not prove they are workers of this market (reason: "
        + ", ".join(REFUSALS)
        + ")",
        ["reason"],
        {},
    ),
    "group_untrusted": (
        Gauge,
        "group_untrusted",
        "1 while /health says 'untrusted_group' (same rule): input partitions "
        "not all held by proven workers, a leader that is not one, or this "
        "worker refused its place; else 0",
        [],
        {},
    ),
    "group_unproven_partitions": (
        Gauge,
        "group_unproven_partitions",
        "Input partitions not held by a proven worker of this market, "
        "as this worker sees its consumer group (held by a member "
        "without a proof, under a leader without one, or by nobody); "
        "/health is 503 while above 0",
        [],
        {},
    ),
    "group_unproven_members": (
        Gauge,
        "group_unproven_members",
        "Members of the workers' consumer group without a valid proof "
        "that they are workers of this market",
        [],
        {},
    ),
    "topics_recreated": (
        Counter,
        "topics_recreated",
        "Topics the market publishes to (kind: inbox, catalog; progress: the "
        "checkpoints) found missing, emptied or with the wrong partition count, "
        "and made again with their settings; what was held for them (the "
        "checkpoints: the newest of each partition served) was then sent",
        ["kind"],
        {},
    ),
    "catalog_republished": (
        Counter,
        "catalog_entries_republished",
        "Catalog entries of this worker's streams published again from "
        "its registered store after the catalog was lost or emptied",
        [],
        {},
    ),
    "page_builds": (
        Counter,
        "page_builds",
        "Builds of an operator page (ledger, metrics): at most one per "
        "EMARKET_LEDGER_EVERY or EMARKET_METRICS_EVERY seconds, whatever the requests",
        ["page"],
        {},
    ),
}


def build_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    """A worker's metrics on ``registry`` (a fresh one by default, never the global one)."""
    # `_created` series (one gauge per counter and histogram child, holding its creation time)
    # double the scrape and answer nothing an operator asks; the switch is process-wide
    disable_created_metrics()  # type: ignore[no-untyped-call]
    reg = registry or CollectorRegistry()
    made = {
        attr: kind(name, help_text, labels, namespace=NS, registry=reg, **extra)
        for attr, (kind, name, help_text, labels, extra) in _SPECS.items()
    }
    m = Metrics(registry=reg, **made)
    for outcome in ("fulfilled", "rejected", "duplicate"):
        m.purchases.labels(outcome)
    for kind in ("purchase", "subscription", "replay"):
        m.releases.labels(kind)
    for cause in DROP_CAUSES:
        m.refusals_dropped.labels(cause)
    for kind in DEAD_LETTER_KINDS:  # at 0 from the start: the first dead letter is an increase
        m.dead_letters.labels(kind)
    for store in (*Stores.NAMES, PROGRESS):  # the same for the first refused state record
        for reason in REFUSED_REASONS:
            m.state_refused.labels(store, reason)
    for reader in ("tables", "replica"):
        m.partitions_unverified.labels(reader).set(0)
    for kind in INPUT_KINDS:
        m.offsets_ahead.labels(kind)
    for reason in REFUSALS:  # and for the first stranger refused a place in the group
        m.group_refused.labels(reason)
    for kind in TOPIC_KINDS:  # and for the first topic someone deleted
        m.topics_recreated.labels(kind)
    for page in PAGES:
        m.page_builds.labels(page)
    return m


#: ``kind`` label of ``emarket_topics_recreated_total``: the topics the market publishes to
#: from its own state, and makes again when they go missing
TOPIC_KINDS = ("inbox", "catalog", "progress")


#: ``page`` label of ``emarket_page_builds_total``: the pages served from a cache
PAGES = ("ledger", "metrics")

#: ``input`` label of ``emarket_offsets_ahead_total``: the input topics, named without prefix
INPUT_KINDS = ("accounts", "registrations", "values", "purchases")

#: ``reason`` label of ``emarket_state_records_refused_total`` (:mod:`streams.worker.history`)
REFUSED_REASONS = ("forged", "moved", "older", "checkpoint", "foreign")

#: ``reason`` label of ``emarket_dead_letters_total``: a closed set, so that every series
#: exists at 0 before its first dead letter (an alert on ``increase`` sees the first one) and
#: the label's cardinality is bounded; the dead-letter record keeps the exact error.
DEAD_LETTER_KINDS = ("too_large", "unauthorized", "unknown_topic", "other")


def dead_letter_kind(exc: BaseException) -> str:
    """The :data:`DEAD_LETTER_KINDS` entry of a broker error."""
    name = type(exc).__name__
    if "TooLarge" in name:
        return "too_large"
    if "Authoriz" in name or "Authenticat" in name:
        return "unauthorized"
    if "UnknownTopic" in name:
        return "unknown_topic"
    return "other"
