"""Prometheus metrics of a worker, built on an injected registry (never the global one).

Names follow ``namespace_subsystem_name_unit``; labels are closed sets (mechanism, outcome,
reason, table) except ``stream``, which is bounded by the operator-controlled catalog and is what
the privacy and revenue ledgers are about.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics", "build_metrics"]

NS = "emarket"
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    values: Counter
    purchases: Counter
    quotes: Counter
    registrations: Counter
    releases: Counter
    noise_draws: Counter
    rejections: Counter
    purchase_latency: Histogram
    batch_size: Histogram
    privacy_spent: Gauge
    privacy_cap: Gauge
    revenue: Counter
    state_entries: Gauge
    state_bytes: Gauge
    consumer_lag: Gauge
    broker_up: Gauge
    last_batch: Gauge


def build_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    reg = registry or CollectorRegistry()
    m = Metrics(
        registry=reg,
        values=Counter(
            "values_ingested",
            "Seller values processed, by outcome",
            ["mechanism", "status"],
            namespace=NS,
            registry=reg,
        ),
        purchases=Counter(
            "purchases",
            "Purchases processed, by outcome (fulfilled, rejected, duplicate)",
            ["outcome"],
            namespace=NS,
            registry=reg,
        ),
        quotes=Counter("quotes", "Quote requests answered", namespace=NS, registry=reg),
        registrations=Counter(
            "registrations",
            "Stream registrations, by outcome",
            ["outcome"],
            namespace=NS,
            registry=reg,
        ),
        releases=Counter(
            "releases",
            "Noisy vectors sent to buyers (kind: purchase, subscription, replay)",
            ["kind"],
            namespace=NS,
            registry=reg,
        ),
        noise_draws=Counter(
            "noise_draws",
            "New privacy levels sampled (fresh noise); replays never add here",
            ["mechanism"],
            namespace=NS,
            registry=reg,
        ),
        rejections=Counter(
            "rejections",
            "Events rejected to the dead-letter topic, by reason",
            ["reason"],
            namespace=NS,
            registry=reg,
        ),
        purchase_latency=Histogram(
            "purchase_latency_seconds",
            "Time from a purchase's broker timestamp to its outcome being acknowledged",
            namespace=NS,
            registry=reg,
            buckets=LATENCY_BUCKETS,
        ),
        batch_size=Histogram(
            "batch_events",
            "Events processed per batch",
            namespace=NS,
            registry=reg,
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
        ),
        privacy_spent=Gauge(
            "privacy_spent",
            "Largest privacy level ever released on the stream (its loss)",
            ["stream"],
            namespace=NS,
            registry=reg,
        ),
        privacy_cap=Gauge(
            "privacy_cap",
            "Cap the seller set on the stream",
            ["stream"],
            namespace=NS,
            registry=reg,
        ),
        revenue=Counter(
            "revenue_minor",
            "Revenue in minor currency units",
            ["stream", "currency"],
            namespace=NS,
            registry=reg,
        ),
        state_entries=Gauge(
            "state_entries",
            "Entries held in each table on this worker",
            ["table"],
            namespace=NS,
            registry=reg,
        ),
        state_bytes=Gauge(
            "state_vector_bytes",
            "Bytes of release vectors held on this worker",
            namespace=NS,
            registry=reg,
        ),
        consumer_lag=Gauge(
            "consumer_lag",
            "Messages not yet processed on this worker's input partitions",
            ["topic"],
            namespace=NS,
            registry=reg,
        ),
        broker_up=Gauge(
            "broker_up",
            "1 when the last broker round trip succeeded, else 0",
            namespace=NS,
            registry=reg,
        ),
        last_batch=Gauge(
            "last_batch_timestamp_seconds",
            "Unix time of the last processed batch",
            namespace=NS,
            registry=reg,
        ),
    )
    for outcome in ("fulfilled", "rejected", "duplicate"):
        m.purchases.labels(outcome)
    for kind in ("purchase", "subscription", "replay"):
        m.releases.labels(kind)
    return m
