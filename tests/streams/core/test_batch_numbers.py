"""A value batch's numbers are checked once per value, and a value they refuse is refused alone.

The core checks each value's numbers once (``streams.core.values``), before the batch's noise
is computed at once (``Vectors.prepare``); the value refused is told in ``values_accepted``,
the others are applied, whether the batch is computed at once or one by one.
"""

from __future__ import annotations

import pytest

from streams.core.products.vectors import Vectors
from streams.wire.events import INBOX_EVENT, ValuesAccepted
from streams.wire.topics import Topics

from ..helpers import MARKET, market_core, purchase, registration, values

T = Topics(MARKET)
BAD = [
    ("wrong_dimension", [1.0, 2.0]),  # two numbers on a 3-dimensional stream
    ("invalid_value", [1.0, 2.0, 1e300]),  # beyond what the release grid holds
]


@pytest.mark.parametrize("at_once", [True, False])
def test_a_value_refused_for_its_numbers_leaves_the_rest_of_its_batch(
    at_once: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not at_once:
        monkeypatch.setattr(Vectors, "prepare", lambda *a: None)
    c = market_core("seller1", "alice")
    assert c.handle(T.registrations, registration("s")).status == "accepted"
    assert (
        c.handle(T.purchases, purchase("s", "alice", "a", target_level=0.5)).status == "fulfilled"
    )
    good = [(f"v{i}", [float(i), 2.0, -3.5]) for i in range(4)]
    items = good[:2] + [(f"bad{k}", x) for k, (_, x) in enumerate(BAD)] + good[2:]
    with c.batch() as deliveries:
        out = c.handle(T.values, values("s", items))
    assert out.status == "accepted", (out.reason, out.outputs[:1])
    (answer,) = [
        e
        for o in out.outputs
        if o.topic == T.inbox("seller1")
        and isinstance(e := INBOX_EVENT.validate_json(o.value), ValuesAccepted)
    ]
    got = {line.value_id: (line.status, line.reason) for line in answer.outcomes}
    assert got == {
        **{v: ("accepted", None) for v, _ in good},
        **{f"bad{k}": ("rejected", code) for k, (code, _) in enumerate(BAD)},
    }
    assert [o.topic for o in deliveries] == [T.inbox("alice")]  # the 4 accepted, delivered
    assert c.stores.releases.keys() >= {f"s/{v}" for v, _ in good}
