"""The privacy ledger: the one writer of what a stream's releases have cost.

Lossless release makes a value's privacy loss the largest level released of it, to anyone; so
the ledger keeps, and it alone writes:

* each retained value's loss (:attr:`ValueEntry.level`);
* the stream's *spent*: the largest level released of any of its values (what the operators'
  gauges show against the cap);
* on a ``window`` stream, each privacy window's sum of its values' losses and the floor below
  which windows are closed.

On a stream registered with privacy unit ``window`` (duration W, window cap C) the same people
are in every value (a thermometer in one home, a per-user counter), so their loss over a window
is the *sum* of its values' losses (basic composition of ε; zCDP adds ρ). Windows are
``[k·W, (k+1)·W)`` in Unix ms of the values' publication times. A release that would push a
window over C is not made: a purchase is refused as a whole (``privacy_window_full``, saying the
headroom, what fits and when the window ends); a subscription delivery is withheld from the
holders whose level does not fit, who are told. A window's sum is kept while a value can still
join it or a retained value of it can still be re-released; beyond that at most
:data:`~streams.core.state.MAX_RECENT_WINDOWS` more, and a value published into a window whose
sum was dropped is refused (``privacy_window_closed``): never counted from zero.

Levels carry their unit (:class:`Level`): ε, ρ and ω never compare or add across units, so a
sum of levels is a sum of one unit by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from ..wire.events import UNIT_OF, WindowStatus
from .outputs import Reject
from .state import MAX_RECENT_WINDOWS, StreamState, ValueEntry

__all__ = [
    "TOLERANCE",
    "Level",
    "PrivacyLedger",
    "Unit",
    "describe",
    "latest_status",
    "status",
]

Unit = Literal["epsilon", "rho", "omega"]

TOLERANCE = 1e-9
"""Relative slack (of the window cap) for sums of floating-point levels: ten steps of 0.1
must fit a cap of 1."""


@dataclass(frozen=True, slots=True)
class Level:
    """A privacy level in its unit: ``epsilon`` (pure DP), ``rho`` (zCDP) or ``omega``
    (Poisson precision). Levels of two units neither compare nor add (``TypeError``)."""

    value: float
    unit: Unit

    def _of(self, other: Level) -> float:
        if not isinstance(other, Level) or other.unit != self.unit:
            raise TypeError(f"a level in {self.unit} cannot be combined with {other!r}")
        return other.value

    def __lt__(self, other: Level) -> bool:
        return self.value < self._of(other)

    def __le__(self, other: Level) -> bool:
        return self.value <= self._of(other)

    def __gt__(self, other: Level) -> bool:
        return self.value > self._of(other)

    def __ge__(self, other: Level) -> bool:
        return self.value >= self._of(other)

    def __add__(self, other: Level) -> Level:
        return Level(self.value + self._of(other), self.unit)

    def __sub__(self, other: Level) -> Level:
        return Level(self.value - self._of(other), self.unit)


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # beyond year 9999: say it in milliseconds
        return f"{ms} ms"


def status(st: StreamState, idx: int) -> WindowStatus:
    """Window ``idx`` of a ``window`` stream as the ledger accounts it."""
    reg = st.registration
    assert reg.window is not None
    spent = st.window_spent.get(idx, 0.0)
    w = reg.window.duration_ms
    return WindowStatus(
        start_ms=idx * w,
        end_ms=(idx + 1) * w,
        unit=UNIT_OF[reg.mechanism],
        cap=reg.window.cap,
        spent=spent,
        headroom=max(0.0, reg.window.cap - spent),
    )


def latest_status(st: StreamState) -> WindowStatus | None:
    """The window of the stream's newest value (``None`` on ``event`` streams)."""
    reg = st.registration
    if reg.window is None:
        return None
    return status(st, st.watermark_ms // reg.window.duration_ms)


def describe(ws: WindowStatus) -> str:
    """A window in words, as a noun phrase: when it runs and what it has spent."""
    return (
        f"privacy window {_iso(ws.start_ms)}–{_iso(ws.end_ms)} (spent {ws.spent:g} of its "
        f"cap {ws.cap:g} {ws.unit}, headroom {ws.headroom:g})"
    )


class PrivacyLedger:
    """What one stream's releases have cost (see the module docstring); every write of a
    value's loss, the stream's spent or a window's sum goes through here.

    Parameters
    ----------
    state : StreamState
        The stream's record, whose ledger fields this writes.
    levels : sequence of float
        The levels for sale, in this stream's unit (what a refusal says still fits).
    changed : callable
        Called after every write (the stream is then saved at the end of the event).
    """

    def __init__(
        self, state: StreamState, levels: Sequence[float], changed: Callable[[], None]
    ) -> None:
        self._st = state
        self._levels = levels
        self._changed = changed
        self.unit: Unit = UNIT_OF[state.registration.mechanism]
        window = state.registration.window
        self._duration = None if window is None else window.duration_ms
        self._cap = None if window is None else window.cap

    def level(self, value: float) -> Level:
        """``value`` as a level of this stream's unit."""
        return Level(float(value), self.unit)

    @property
    def spent(self) -> Level:
        """The largest level released of any of the stream's values."""
        return self.level(self._st.spent)

    @property
    def windowed(self) -> bool:
        """Whether the stream accounts privacy per window."""
        return self._duration is not None

    def window_of(self, published_at_ms: int) -> int:
        """The index of the window a value published at ``published_at_ms`` belongs to."""
        assert self._duration is not None
        return published_at_ms // self._duration

    # -- values ---------------------------------------------------------------------------------
    def check_open(self, published_at_ms: int, value_id: str) -> None:
        """Refuse (``privacy_window_closed``) a value whose window's sum was dropped: it would
        be counted from zero."""
        if self._duration is None:
            return
        idx = self.window_of(published_at_ms)
        if idx <= self._st.window_floor and idx not in self._st.window_spent:
            ws = status(self._st, idx)
            raise Reject(
                "privacy_window_closed",
                f"value {value_id!r} was published in the privacy window {_iso(ws.start_ms)}–"
                f"{_iso(ws.end_ms)}, which the market no longer accounts (it keeps the windows "
                f"of the values it retains and up to {MAX_RECENT_WINDOWS} more that values can "
                "still join); publish values in order and on time",
            )

    def fitting(self, published_at_ms: int, current: Level, wanted: Iterable[Level]) -> set[Level]:
        """The ``wanted`` levels a value (published at ``published_at_ms``, released up to
        ``current`` so far) may be released at without overspending its window: all of them on
        other streams. Nothing new costs nothing, so levels up to ``current`` always fit."""
        levels = set(wanted)
        if self._cap is None:
            return levels
        spent = self._st.window_spent.get(self.window_of(published_at_ms), 0.0)
        limit = self.level(current.value + (self._cap - spent) + self._cap * TOLERANCE)
        return {lv for lv in levels if lv <= current or lv <= limit}

    def record_value(self, entry: ValueEntry, released: Iterable[Level]) -> None:
        """The value of ``entry`` was released at ``released``: its loss becomes the largest
        (its window's sum grows by the difference), and so may the stream's spent. On a
        ``window`` stream the value's window is kept open even when nothing was released."""
        current = self.level(entry.level)
        top = max(released, default=current)
        if self._duration is not None:
            idx = self.window_of(entry.published_at_ms)
            sums = self._st.window_spent
            sums[idx] = sums.get(idx, 0.0) + max(0.0, top.value - current.value)
        if top > current:
            entry.level = top.value
        self._st.spent = max(self._st.spent, top.value)
        self._changed()

    def record_held_by_market(self, level: Level) -> None:
        """The market computed (and keeps to itself) a release at ``level``: a sealed stream's
        cap-level release, counted in the stream's spent."""
        self._st.spent = max(self._st.spent, level.value)
        self._changed()

    # -- purchases ------------------------------------------------------------------------------
    def fitting_purchase(self, levels: Sequence[Level]) -> list[bool]:
        """Which of ``levels`` a purchase could release now on every retained value without
        overspending any window (all of them on other streams, or with no retained value)."""
        if self._cap is None or not self._st.window or not levels:
            return [True] * len(levels)
        windows, added = self._window_sums(levels)
        room = (added <= self._headroom(windows)[None, :]) | (added == 0.0)  # nothing new: free
        ok: NDArray[np.bool_] = np.all(room, axis=1)
        return [bool(x) for x in ok.tolist()]

    def check_purchase(self, level: Level) -> None:
        """Refuse (``privacy_window_full``) a purchase releasing ``level`` on the retained
        values if that would overspend a window; say by how much, what fits and when it frees."""
        st = self._st
        if self._cap is None or not st.window:
            return
        windows, added = self._window_sums([level])
        over = np.where(added[0] == 0.0, 0.0, added[0] - self._headroom(windows))
        if (over <= 0).all():
            return
        j = int(np.argmax(over))
        k = int(windows[j])
        ws = status(st, k)
        n = sum(1 for e in st.window if self.window_of(e.published_at_ms) == k)
        sellable = [self.level(lv) for lv in self._levels]
        fits = [lv for lv, ok in zip(sellable, self.fitting_purchase(sellable), strict=True) if ok]
        best = (
            f"the most accurate level that fits now is {max(fits).value:g}"
            if fits
            else ("no level fits now")
        )
        raise Reject(
            "privacy_window_full",
            f"releasing the level asked for on the {n} values of this stream's {describe(ws)} "
            f"would spend {float(added[0][j]):g} more; {best}. New values count against the next "
            f"window from {_iso(ws.end_ms)}; this window's values stop being covered by "
            f"purchases once {st.registration.retain_last} newer values have arrived",
            window=ws.model_dump(),
            best_level=max(fits).value if fits else None,
        )

    def record_purchase(self, level: Level) -> None:
        """Every retained value was released at ``level`` (after :meth:`check_purchase` let
        it through): their losses, their windows' sums and the stream's spent."""
        st = self._st
        for e in st.window:
            if level.value > e.level:
                if self._duration is not None:
                    k = self.window_of(e.published_at_ms)
                    st.window_spent[k] = st.window_spent.get(k, 0.0) + (level.value - e.level)
                e.level = level.value
        if st.window:
            st.spent = max(st.spent, level.value)
        self._changed()

    # -- upkeep ---------------------------------------------------------------------------------
    def prune(self, horizon_ms: int) -> None:
        """Drop sums no release can change any more; beyond that keep the newest
        :data:`~streams.core.state.MAX_RECENT_WINDOWS`, closing older ones."""
        st = self._st
        if self._duration is None:
            return
        joinable = max(0, st.watermark_ms - horizon_ms) // self._duration  # none can join below
        if (
            len(st.window_spent) <= MAX_RECENT_WINDOWS
            and min(st.window_spent, default=joinable) >= joinable
        ):
            return  # nothing to drop (the usual case: one pass over the few sums, not the window)
        retained = {self.window_of(e.published_at_ms) for e in st.window}
        recent = sorted(k for k in st.window_spent if k not in retained and k >= joinable)
        dropped = [k for k in st.window_spent if k not in retained and k < joinable]
        dropped += recent[: max(0, len(recent) - MAX_RECENT_WINDOWS)]
        for k in dropped:
            del st.window_spent[k]
            st.window_floor = max(st.window_floor, k)
        self._changed()

    def _window_sums(
        self, levels: Sequence[Level]
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """For each candidate level, what releasing it on every retained value would add to
        each window that has retained values: (windows, added[candidate, window])."""
        assert self._duration is not None
        st = self._st
        held = np.array([e.level for e in st.window], dtype=np.float64)
        idx = np.array([e.published_at_ms for e in st.window], dtype=np.int64) // self._duration
        order = np.argsort(idx, kind="stable")
        idx, held = idx[order], held[order]
        windows, starts = np.unique(idx, return_index=True)
        cand = np.array([lv.value for lv in levels], dtype=np.float64)
        added = np.maximum(0.0, cand[:, None] - held[None, :])
        return windows, np.add.reduceat(added, starts, axis=1)

    def _headroom(self, windows: NDArray[np.int64]) -> NDArray[np.float64]:
        assert self._cap is not None
        sums = self._st.window_spent
        spent = np.array([sums.get(int(k), 0.0) for k in windows], dtype=np.float64)
        return self._cap - spent + self._cap * TOLERANCE
