"""Privacy windows: what the seller of a ``window`` stream really spends, and its cap.

On a stream registered with privacy unit ``window`` (duration W, window cap C), the same people
are in every value (a thermometer in one home, a per-user counter), so their privacy loss over
a window is the *sum* over its values of each value's loss (basic composition of ε; zCDP adds
ρ). Lossless release makes a value's loss the largest level released of it, to anyone, so the
market keeps that level per retained value (:attr:`ValueEntry.level`) and per window the sum
(:attr:`StreamState.window_spent`). Windows are ``[k·W, (k+1)·W)`` in Unix ms of the values'
publication times (``k`` is the window's index).

A release that would push a window over C is not made. A purchase (which releases every value
the stream retains at the level bought) is refused as a whole, ``privacy_window_full``, saying
the headroom, the most accurate level that still fits and when the window ends; a subscription
delivery is withheld from the holders whose level does not fit, and they are told
(:class:`~streams.wire.events.DeliveriesWithheld`). Holders whose level fits still get the
value: the value's cost is the largest level actually released.

The sums are part of the stream's record, so they survive restarts and rebalances with it. A
window's sum is kept while a value can still join it (it is within the dedup horizon of the
newest value) or a retained value of it can still be re-released by a purchase; beyond that at
most :data:`~streams.core.state.MAX_RECENT_WINDOWS` more are kept, and a value published into
a window whose sum was dropped is refused (``privacy_window_closed``): never counted from zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import numpy as np
from numpy.typing import NDArray

from ..wire.events import UNIT_OF, StreamRegistration, WindowStatus
from .outputs import Reject
from .state import MAX_RECENT_WINDOWS, StreamState

__all__ = [
    "TOLERANCE",
    "admit_value",
    "charge_purchase",
    "check_purchase",
    "describe",
    "fitting_levels",
    "index_of",
    "is_window",
    "latest_status",
    "open_for_value",
    "prune",
    "status",
]

TOLERANCE = 1e-9
"""Relative slack (of the window cap) for sums of floating-point levels: ten steps of 0.1
must fit a cap of 1."""


def is_window(reg: StreamRegistration) -> bool:
    """Whether the stream accounts privacy per window."""
    return reg.window is not None


def index_of(reg: StreamRegistration, published_at_ms: int) -> int:
    """The window a value published at ``published_at_ms`` belongs to."""
    assert reg.window is not None
    return published_at_ms // reg.window.duration_ms


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # beyond year 9999: say it in milliseconds
        return f"{ms} ms"


def status(st: StreamState, idx: int) -> WindowStatus:
    """Window ``idx`` of the stream as the market accounts it."""
    reg = st.registration
    assert reg.window is not None
    spent = st.window_spent.get(idx, 0.0)
    w = reg.window.duration_ms
    return WindowStatus(start_ms=idx * w, end_ms=(idx + 1) * w, unit=UNIT_OF[reg.mechanism],
                        cap=reg.window.cap, spent=spent,
                        headroom=max(0.0, reg.window.cap - spent))  # fmt: skip


def latest_status(st: StreamState) -> WindowStatus | None:
    """The window of the stream's newest value (``None`` on ``event`` streams)."""
    if not is_window(st.registration):
        return None
    return status(st, index_of(st.registration, st.watermark_ms))


def describe(ws: WindowStatus) -> str:
    """A window in words, as a noun phrase: when it runs and what it has spent."""
    return (f"privacy window {_iso(ws.start_ms)}–{_iso(ws.end_ms)} (spent {ws.spent:g} of its "
            f"cap {ws.cap:g} {ws.unit}, headroom {ws.headroom:g})")  # fmt: skip


def open_for_value(st: StreamState, idx: int, value_id: str) -> None:
    """Refuse a value whose window's sum was dropped: it would be counted from zero."""
    if idx <= st.window_floor and idx not in st.window_spent:
        ws = status(st, idx)
        raise Reject(
            "privacy_window_closed",
            f"value {value_id!r} was published in the privacy window {_iso(ws.start_ms)}–"
            f"{_iso(ws.end_ms)}, which the market no longer accounts (it keeps the windows of "
            f"the values it retains and up to {MAX_RECENT_WINDOWS} more that values can still "
            "join); publish values in order and on time",
        )


def admit_value(st: StreamState, idx: int, current: float, levels: Iterable[float]) -> set[float]:
    """The held ``levels`` a value of window ``idx`` may be released at, and record the spend.

    ``current`` is the largest level already released of the value. A level fits if raising
    the value to it keeps the window within its cap; the value's new cost is the largest level
    that fits (releasing the others below it costs nothing more, by losslessness).
    """
    wanted = set(levels)
    reg = st.registration
    if reg.window is None:
        return wanted
    spent = st.window_spent.get(idx, 0.0)
    limit = current + (reg.window.cap - spent) + reg.window.cap * TOLERANCE
    fits = {lv for lv in wanted if lv <= current or lv <= limit}  # nothing new costs nothing
    top = max(fits, default=current)
    if top > current:
        st.window_spent[idx] = spent + (top - current)
    elif idx not in st.window_spent:
        st.window_spent[idx] = spent  # the window is open: keep its (zero) sum
    return fits


def _window_sums(
    st: StreamState, levels: Sequence[float]
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """For each candidate level, what releasing it on every retained value would add to each
    window that has retained values: (windows, added[candidate, window])."""
    reg = st.registration
    assert reg.window is not None
    held = np.array([e.level for e in st.window], dtype=np.float64)
    idx = np.array([e.published_at_ms for e in st.window], dtype=np.int64) // reg.window.duration_ms
    order = np.argsort(idx, kind="stable")
    idx, held = idx[order], held[order]
    windows, starts = np.unique(idx, return_index=True)
    cand = np.asarray(levels, dtype=np.float64)
    added = np.maximum(0.0, cand[:, None] - held[None, :])
    return windows, np.add.reduceat(added, starts, axis=1)


def _headroom(st: StreamState, windows: NDArray[np.int64]) -> NDArray[np.float64]:
    reg = st.registration
    assert reg.window is not None
    spent = np.array([st.window_spent.get(int(k), 0.0) for k in windows], dtype=np.float64)
    return reg.window.cap - spent + reg.window.cap * TOLERANCE


def fitting_levels(st: StreamState, levels: Sequence[float]) -> list[bool]:
    """Which of ``levels`` a purchase could release now without overspending any window
    (all of them on ``event`` streams, and on a stream with no retained value)."""
    if not is_window(st.registration) or not st.window or not levels:
        return [True] * len(levels)
    windows, added = _window_sums(st, levels)
    room = (added <= _headroom(st, windows)[None, :]) | (added == 0.0)  # nothing new: free
    ok: NDArray[np.bool_] = np.all(room, axis=1)
    return [bool(x) for x in ok.tolist()]


def check_purchase(st: StreamState, level: float, sellable: Sequence[float]) -> None:
    """Refuse (``privacy_window_full``) a purchase releasing ``level`` on the retained values
    if that would overspend a window; say by how much, what fits and when it frees."""
    if not is_window(st.registration) or not st.window:
        return
    windows, added = _window_sums(st, [level])
    over = np.where(added[0] == 0.0, 0.0, added[0] - _headroom(st, windows))
    if (over <= 0).all():
        return
    j = int(np.argmax(over))
    k = int(windows[j])
    ws = status(st, k)
    n = sum(1 for e in st.window if index_of(st.registration, e.published_at_ms) == k)
    fits = [lv for lv, ok in zip(sellable, fitting_levels(st, sellable), strict=True) if ok]
    best = f"the most accurate level that fits now is {max(fits):g}" if fits else (
        "no level fits now")  # fmt: skip
    raise Reject(
        "privacy_window_full",
        f"releasing level {level:g} on the {n} values of this stream's {describe(ws)} would "
        f"spend {float(added[0][j]):g} more; {best}. New values count "
        f"against the next window from {_iso(ws.end_ms)}; this window's values stop being "
        f"covered by purchases once {st.registration.retain_last} newer values have arrived",
        window=ws.model_dump(),
        best_level=max(fits) if fits else None,
    )


def charge_purchase(st: StreamState, level: float) -> None:
    """Record that every retained value was released at ``level`` (after
    :func:`check_purchase` let it through)."""
    window = st.registration.window
    for e in st.window:
        if level > e.level:
            if window is not None:
                k = index_of(st.registration, e.published_at_ms)
                st.window_spent[k] = st.window_spent.get(k, 0.0) + (level - e.level)
            e.level = level


def prune(st: StreamState, horizon_ms: int) -> None:
    """Drop sums no release can change any more; beyond that keep the newest
    :data:`~streams.core.state.MAX_RECENT_WINDOWS`, closing older ones."""
    reg = st.registration
    if reg.window is None:
        return
    w = reg.window.duration_ms
    joinable = max(0, st.watermark_ms - horizon_ms) // w  # no value can join a window below
    if len(st.window_spent) <= MAX_RECENT_WINDOWS and min(st.window_spent, default=joinable) >= (
        joinable
    ):
        return  # nothing to drop (the usual case: one pass over the few sums, not the window)
    retained = {index_of(reg, e.published_at_ms) for e in st.window}
    recent = sorted(k for k in st.window_spent if k not in retained and k >= joinable)
    dropped = [k for k in st.window_spent if k not in retained and k < joinable]
    dropped += recent[: max(0, len(recent) - MAX_RECENT_WINDOWS)]
    for k in dropped:
        del st.window_spent[k]
        st.window_floor = max(st.window_floor, k)
