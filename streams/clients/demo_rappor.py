"""The RAPPOR part of the demo: a survey's answers, released by randomized response bought step
by step.

A seller publishes 300 members' answers to one question (one of four browsers, one set bit per
member); a buyer buys three levels and estimates each browser's share with its 95 % interval.
Each step relaxes the same stored noise (a lossless Laplace relaxation), so the randomized
response flips fewer bits and the intervals narrow, while the buyer's loss is the top level's.
"""

from __future__ import annotations

import time

import numpy as np

from ..wire.events import Rejection
from .client import MarketClient
from .keys import Party
from .rappor import frequencies

__all__ = ["play_rappor"]

STEPS = [1.0, 4.0, 16.0]
BROWSERS = ["firefox", "chrome", "safari", "other"]
SHARES = [0.4, 0.3, 0.2, 0.1]
MEMBERS = 300


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


async def play_rappor(client: MarketClient, buyer: Party) -> None:
    """Register the survey stream, publish the answers in one batch, buy its steps, print the
    estimated shares."""
    k = len(BROWSERS)
    entry = await client.register(
        {
            "stream_id": "browser-survey",
            "mechanism": "laplace",
            "sensitivity": 2.0,  # two answers differ in at most two bits
            "dimension": k,
            "product": "rappor",
            "rappor_ones": 1,
            "steps": STEPS,
            "cap": STEPS[-1],
            "retain_last": MEMBERS,
            "pricing": {"kind": "linear_level", "rate_per_level": 10.0},
            "currency": "EUR",
            "description": "each member's browser, one bit of four; randomized response",
        },
        timeout=60,
    )
    if isinstance(entry, Rejection):
        raise RuntimeError(f"registration rejected: {entry.message}")
    answers = np.repeat(np.arange(k), [round(s * MEMBERS) for s in SHARES])
    items = [(f"member-{i}", np.eye(k)[a].tolist(), None) for i, a in enumerate(answers)]
    await client.publish_batch(client.value_batch("browser-survey", items))
    _say(
        f"seller registered 'browser-survey' (RAPPOR, {k} bits, one set) and published "
        f"{MEMBERS} members' answers; true shares "
        + ", ".join(f"{b} {s:.0%}" for b, s in zip(BROWSERS, SHARES, strict=True))
    )
    print("  step   level ε   P(bit 1 | 0)   P(bit 1 | 1)   estimated share (95 % interval)")
    for step in range(1, len(STEPS) + 1):
        out = await client.buy("browser-survey", max_price_minor=10_000, timeout=60, party=buyer)
        if isinstance(out, Rejection):
            raise RuntimeError(f"purchase rejected: {out.message}")
        est = frequencies(out)
        rr = out.error_model.randomized_response if out.error_model else None
        shares = "  ".join(
            f"{b} {f:.2f} [{lo:.2f}, {hi:.2f}]"
            for b, f, lo, hi in zip(BROWSERS, est.fraction, est.low, est.high, strict=True)
        )
        law = f"{rr.p_if_0:>12.3f}   {rr.p_if_1:>12.3f}" if rr else f"{'?':>12}   {'?':>12}"
        print(f"  {step:>4}   {out.level_after:>7g}   {law}   {shares}")
    print()
    _say(
        "each step relaxed the same stored noise: the buyer's bits at ε=16 tell it everything "
        "the earlier ones did, and its loss is ε=16, not the sum of its steps"
    )
