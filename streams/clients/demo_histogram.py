"""The histogram part of the demo: visits per city, bought step by step.

A seller publishes one day of visits per city (a sparse count map over every string); a buyer
buys three steps and sees the cities above each step's threshold, with counts that get more
accurate and thresholds that come down, so smaller cities appear.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..wire.events import Rejection
from .client import MarketClient
from .histograms import named
from .keys import Party

__all__ = ["play_histograms"]

STEPS = [0.02, 0.2, 2.0]
VISITS = {
    "berlin": 412.0,
    "paris": 388.0,
    "rome": 251.0,
    "madrid": 97.0,
    "oslo": 38.0,
    "vienna": 21.0,
    "lisbon": 9.0,
    "riga": 4.0,
    "tallinn": 2.0,
    "vaduz": 1.0,
}


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


async def play_histograms(client: MarketClient, buyer: Party) -> None:
    """Register the city-visits stream, publish a day, buy its steps, print what each shows."""
    entry = await client.register(
        {
            "stream_id": "city-visits",
            "mechanism": "gaussian",
            "sensitivity": 1.0,
            "dimension": 100,
            "steps": STEPS,
            "cap": STEPS[-1],
            "retain_last": 4,
            "product": "histogram",
            "histogram": {"key_space": "strings", "false_keys": 1.0},
            "pricing": {"kind": "linear_level", "rate_per_level": 100.0},
            "currency": "EUR",
            "description": "visits per city and day; one visitor changes one count by one",
        },
        timeout=60,
    )
    if isinstance(entry, Rejection):
        raise RuntimeError(f"registration rejected: {entry.message}")
    await client.publish("city-visits", VISITS, value_id="day-1")
    _say(
        f"seller registered 'city-visits' (histograms over any string; {len(VISITS)} cities "
        "today) and published day-1; a key shows only above its level's threshold"
    )
    print("  step   level ρ   threshold   cities shown   unnamed keys   RMS error of shown")
    for step in range(1, len(STEPS) + 1):
        out = await client.buy("city-visits", max_price_minor=10_000, timeout=60, party=buyer)
        if isinstance(out, Rejection):
            raise RuntimeError(f"purchase rejected: {out.message}")
        (release,) = out.releases
        counts, unnamed = named(release, VISITS)
        err = [counts[c] - VISITS[c] for c in counts]
        rms = float(np.sqrt(np.mean(np.square(err)))) if err else math.nan
        tau = out.error_model.threshold if out.error_model else math.nan
        print(
            f"  {step:>4}   {out.level_after:>7g}   {tau:>9.1f}   {len(counts):>12}   "
            f"{unnamed:>12}   {rms:>18.2f}"
        )
    print()
    _say(
        "the buyer named the keys from the cities it knows; keys of cities with no visit today "
        "show up only as often as the seller's false_keys (1 per day, on average) allows"
    )
