"""What a buyer of a RAPPOR stream learns: each bit's (each category's) frequency in the
population, with a confidence interval, from the bits released at one level.

>>> est = frequencies(event)                 # doctest: +SKIP
>>> est.fraction, est.low, est.high          # doctest: +SKIP

The released bits of one level are i.i.d. randomized responses of the members' bits, with the
law the release states (``error_model.randomized_response``, docs/protocol.md §1.10); the
estimate inverts it (:func:`market.rappor.estimate_bits`). Needs only the base package.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from market.rappor import BitEstimate, MarketResponse, estimate_bits

__all__ = ["frequencies", "response_of"]


def response_of(event: Any) -> MarketResponse:
    """The randomized response of the bits of a ``purchase_fulfilled`` or ``value_released``
    event of a RAPPOR stream (its ``error_model.randomized_response``)."""
    info = getattr(event, "error_model", None)
    rr = None if info is None else info.randomized_response
    if rr is None:
        raise ValueError(
            "this event states no randomized response: it is not a release of a 'rappor' "
            "stream (buy or subscribe to one; `epsilon-market catalog` lists each stream's "
            "product)"
        )
    return MarketResponse(rr.p_if_0, rr.p_if_1, rr.f)


def frequencies(events: Any | Iterable[Any], confidence: float = 0.95) -> BitEstimate:
    """Each bit's population frequency from the releases of ``events`` (one event, or several
    at one level: a purchase and the subscription deliveries after it).

    Raises
    ------
    ValueError
        No release, or releases at different levels (their bits follow different laws:
        estimate each level apart, or buy the highest and use only its bits).
    """
    evs = [events] if hasattr(events, "releases") else list(events)
    rows = [r for e in evs for r in e.releases]
    if not rows:
        raise ValueError("no released values to estimate from")
    levels = {r.level for r in rows}
    if len(levels) != 1:
        raise ValueError(
            f"releases at levels {sorted(levels)}: the bits of each level follow their own "
            "law; pass the releases of one level"
        )
    response = response_of(evs[0])
    return estimate_bits(np.asarray([r.values for r in rows]), response, confidence=confidence)
