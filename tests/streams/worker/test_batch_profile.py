"""The batch profile's first column: how long a batch's oldest event waited before the batch.

Faust stamps each event's message with its producer's timestamp in seconds (``None`` or 0 when
the record carries none); the column must take the oldest real stamp and ignore the others.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from streams.worker.batch import _waited_ms


def _event(timestamp: float | None) -> SimpleNamespace:
    return SimpleNamespace(message=SimpleNamespace(timestamp=timestamp))


def test_the_oldest_stamped_event_sets_the_wait() -> None:
    now = time.time()
    waited = _waited_ms([_event(now - 0.010), _event(now - 0.250), _event(None), _event(0.0)])
    # at least the oldest stamp's 250 ms (the clock only moves on); the newest would give 10
    assert 250.0 <= waited < 60_000.0


def test_events_without_stamps_wait_nothing() -> None:
    assert _waited_ms([_event(None), _event(0.0)]) == 0.0
