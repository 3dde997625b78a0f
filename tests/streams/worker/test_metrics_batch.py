"""Metrics are counted per batch: nothing shows before the flush, then sums and last values."""

from __future__ import annotations

from prometheus_client import generate_latest

from market.privacy_units import cap_of, level_of, spend_of
from streams.core.outputs import Outcome, StreamFigures
from streams.worker.metrics import build_metrics


def _figures(spent: float) -> StreamFigures:
    return StreamFigures(
        "s1",
        "laplace",
        "epsilon",
        spent,
        2.0,
        "EUR",
        window_spent=spent,
        window_cap=1.5,
        window_headroom=level_of(max(0, cap_of(1.5) - spend_of(spent))),
    )


def _sample(m: object, name: str, **labels: str) -> float | None:
    value = m.registry.get_sample_value(name, labels)  # type: ignore[attr-defined]
    return None if value is None else float(value)


def test_a_batch_is_counted_once_flushed_with_sums_and_last_values() -> None:
    m = build_metrics()
    m.record(
        Outcome(
            "purchase",
            "fulfilled",
            mechanism="laplace",
            releases=4,
            new_noise=4,
            price_minor=50,
            figures=_figures(0.5),
        )
    )
    m.record(
        Outcome(
            "purchase",
            "fulfilled",
            mechanism="laplace",
            releases=4,
            new_noise=4,
            price_minor=70,
            figures=_figures(1.0),
        )
    )
    m.record(
        Outcome(
            "value",
            "accepted",
            mechanism="laplace",
            releases=2,
            items=[("accepted", None), ("rejected", "conflicting_value")],
        )
    )
    m.record(Outcome("purchase", "rejected", reason="price_too_high"))
    m.record(Outcome("quote", "accepted"))
    m.record(Outcome("value", "forwarded"))
    assert not _sample(m, "emarket_purchases_total", outcome="fulfilled")  # not yet
    m.flush()
    assert _sample(m, "emarket_purchases_total", outcome="fulfilled") == 2
    assert _sample(m, "emarket_purchases_total", outcome="rejected") == 1
    assert _sample(m, "emarket_releases_total", kind="purchase") == 8
    assert _sample(m, "emarket_releases_total", kind="subscription") == 2
    assert _sample(m, "emarket_noise_draws_total", mechanism="laplace") == 8
    assert _sample(m, "emarket_rejections_total", reason="price_too_high") == 1
    assert _sample(m, "emarket_rejections_total", reason="conflicting_value") == 1
    assert _sample(m, "emarket_quotes_total") == 1
    assert _sample(m, "emarket_events_forwarded_total", kind="value") == 1
    assert _sample(m, "emarket_revenue_minor_total", stream="s1", currency="EUR") == 120
    ledger = {"stream": "s1", "mechanism": "laplace", "unit": "epsilon"}
    assert _sample(m, "emarket_privacy_spent", **ledger) == 1.0  # the batch's last value
    assert _sample(m, "emarket_privacy_window_headroom", **ledger) == 0.5
    m.flush()  # nothing held twice
    assert _sample(m, "emarket_purchases_total", outcome="fulfilled") == 2
    assert b"emarket_purchases_total" in generate_latest(m.registry)
