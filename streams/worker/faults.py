"""Fail points for crash testing: kill the worker at chosen points of a batch.

Inactive unless ``EMARKET_FAULTS`` is set, e.g. ``EMARKET_FAULTS=after_state:0.2,mid_output:0.1``
(point:probability) with an optional ``EMARKET_FAULT_SEED``; ``EMARKET_POISON=marker`` makes the
handling of any event containing ``marker`` raise (one bad event among others). A hit calls
``os._exit(137)``:
no cleanup, no offset commit, no flush, exactly like SIGKILL. Points:

* ``before_state`` — a batch was taken, nothing applied;
* ``mid_batch`` — half the batch applied in memory, nothing persisted;
* ``mid_state`` — the records of values, purchases and accounts durable, the streams' not;
* ``after_state`` — state durable (changelog acknowledged), no output sent;
* ``mid_output`` — state durable, half the outputs sent;
* ``after_output`` — everything sent, offsets not yet committed.
"""

from __future__ import annotations

import asyncio
import logging
import os

import numpy as np

__all__ = ["POINTS", "FaultInjector"]

POINTS = ("before_state", "mid_batch", "mid_state", "after_state", "mid_output", "after_output")
log = logging.getLogger(__name__)


class FaultInjector:
    def __init__(
        self, probabilities: dict[str, float], seed: int | None = None, poison: bytes = b""
    ) -> None:
        unknown = set(probabilities) - set(POINTS)
        if unknown:
            raise ValueError(f"unknown fail points {sorted(unknown)}; known: {POINTS}")
        self.probabilities = probabilities
        self.poison_marker = poison
        self.hang_marker = os.environ.get("EMARKET_HANG", "").encode()
        self.break_marker = os.environ.get("EMARKET_BREAK", "").encode()
        self._rng = np.random.default_rng(seed)  # test-only chaos, not privacy noise

    @classmethod
    def from_env(cls) -> FaultInjector:
        spec = os.environ.get("EMARKET_FAULTS", "")
        probs: dict[str, float] = {}
        for item in filter(None, (x.strip() for x in spec.split(","))):
            point, _, p = item.partition(":")
            probs[point] = float(p or 1.0)
        seed = os.environ.get("EMARKET_FAULT_SEED")
        poison = os.environ.get("EMARKET_POISON", "").encode()
        if probs or poison:
            log.warning("fault injection active: %s, poison %r", probs, poison)
        return cls(probs, int(seed) if seed else None, poison)

    def poison(self, value: bytes | None) -> None:
        """Raise inside the handling of an event carrying the poison marker (crash tests)."""
        if self.poison_marker and value and self.poison_marker in value:
            raise RuntimeError("fault injection: poisoned event")

    def broken(self, values: list[bytes]) -> None:
        """Raise outside the core's guard, after a batch carrying the ``EMARKET_BREAK`` marker
        was applied in memory and before anything is sent: a bug in the worker's own code."""
        if self.break_marker and any(self.break_marker in v for v in values if v):
            raise RuntimeError("fault injection: a batch broke outside the core")

    async def hang(self, value: bytes | None) -> None:
        """Block (until cancelled) on an event carrying the ``EMARKET_HANG`` marker: a worker
        stuck on one event, for /health and shutdown tests."""
        if self.hang_marker and value and self.hang_marker in value:
            log.warning("fault injection: hanging on an event")
            await asyncio.sleep(3600)

    def hit(self, point: str) -> None:
        p = self.probabilities.get(point)
        if p and self._rng.random() < p:
            log.warning("fault injection: crashing at %s", point)
            logging.shutdown()
            os._exit(137)
