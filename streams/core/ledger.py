"""The privacy ledger: the one gate every release passes, and the one writer of what it cost.

Lossless release makes a value's privacy loss the largest level released of it, to anyone; so
the ledger keeps, and it alone writes:

* each retained value's loss (:attr:`ValueEntry.level`, the level itself: the chain needs the
  exact double back, and its nano-units are :func:`~.privacy_units.spend_of` it);
* the stream's *spent*: the largest level released of any of its values (what the operators'
  gauges show against the cap);
* on a ``window`` stream, each privacy window's sum of its values' losses and the floor below
  which windows are closed;
* what a purchase charges: the buyer's holding and the stream's revenue.

**One gate.** A release is made through one call that checks, releases, then records:
:meth:`PrivacyLedger.sell` for a purchase, :meth:`PrivacyLedger.deliver` for a value's
subscription deliveries (and a resend's). The call works out the :class:`Spend` (what the
release adds to each window), runs every check on it, and only if all pass calls the caller's
``release``; whatever that raises, nothing has been recorded. Then it records the spend (and a
purchase's charge) with plain assignments of values computed beforehand, which cannot fail half
way. The predicates (:meth:`PrivacyLedger.fitting_purchase`, what quotes show) run the same
checks and change nothing. A resent purchase whose outcome is recomputed from its decision
(:mod:`.purchases`) sends again bytes the gate accounted when they were first made, and records
nothing.

**Exact accounting.** Privacy is counted in integers of 10⁻⁹ of the stream's unit
(:mod:`.privacy_units`): a value's loss is its level's canonical decimal rounded up, a window
cap is rounded down, and sums and comparisons are exact; there is no tolerance.

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

**Adding a check.** A check is a function of the ledger and a :class:`Spend` that returns a
:class:`Shortfall` (which window, or cap, has too little room, and by how much) or ``None``;
:data:`CHECKS` lists them and both the gate and the predicates run them all. Each adds its
state to the stream's record, written only in :meth:`PrivacyLedger._commit` and the commit of
deliveries, so a release is still recorded all at once or not at all.

**Reservations** (:mod:`.holds`) are the check :func:`reserved_room`, which counts the room
other buyers' held reservations hold as spent (``Spend.buyer_id``: a buyer's own is room it may
use); :meth:`PrivacyLedger.hold` is the whole gate asked for a reservation's room (so a
reservation also keeps within the buyer's share), and a purchase's commit uses its buyer's
reservation.

**Per-buyer shares** (:mod:`.quotas`) are such a check, :func:`buyer_share`: on a stream
registered with a ``buyer_share``, a release at a level L reaching values of windows
``Spend.windows`` fails if L is above one buyer's share of the stream's cap, or if L times
the values of one of those windows (with ``Spend.new_values``; for a buyer holding nothing, the
retained ones, ``Spend.fresh``) is above its share of the window's cap. Its state is one
count of values per window (``StreamRecord.window_values``), written in the commit of a new
value's deliveries and dropped with the window's sum.

Levels carry their unit (:class:`Level`): ε, ρ and ω never compare or add across units, so a
sum of levels is a sum of one unit by construction.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import accumulate
from typing import Generic, Literal, TypeVar

from market.privacy_units import cap_of, level_of, spend_of

from ..wire.events import UNIT_OF, WindowStatus
from . import quotas
from .holds import consume, held_by_others, held_note
from .outputs import Reject
from .state import MAX_RECENT_WINDOWS, Holder, StreamState, ValueEntry

__all__ = [
    "CHECKS",
    "Check",
    "Level",
    "Made",
    "PrivacyLedger",
    "Shortfall",
    "Spend",
    "Unit",
    "buyer_share",
    "describe",
    "latest_status",
    "reserved_room",
    "status",
    "window_room",
]

Unit = Literal["epsilon", "rho", "omega"]
R = TypeVar("R")


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

    @property
    def nanos(self) -> int:
        """The level as a spend: nano-units, rounded up (:mod:`.privacy_units`)."""
        return spend_of(self.value)


@dataclass(frozen=True, slots=True)
class Spend:
    """What one release would add: per window, in nano-units.

    Attributes
    ----------
    level : Level
        The level released (a purchase's, or one level of a delivery).
    added : mapping of int to int
        Window index → nano-units the release adds to its sum (only windows it adds to).
    buyer_id : str or None
        The buyer of a purchase (``None`` for a delivery, which goes to every holder of the
        level).
    price_minor : int
        What the purchase charges (0 for a delivery).
    windows : frozenset of int
        The windows of the values the release reaches, whether or not it adds to their sums
        (what a buyer learns of them is counted against its share, :func:`buyer_share`).
    new_values : int
        Values the release adds to its windows' counts: 1 for a value just published.
    fresh : mapping of int to int or None
        A purchase by a buyer that holds nothing (so was released nothing before): the values
        of each window it will then have had, the retained ones, which its share counts
        instead of all the window's values.
    """

    level: Level
    added: Mapping[int, int]
    buyer_id: str | None = None
    price_minor: int = 0
    windows: frozenset[int] = frozenset()
    new_values: int = 0
    fresh: Mapping[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a spend does not fit: window ``window`` (``None``: the stream's cap) would go
    ``over`` nano-units above its cap, or (``reason`` ``buyer_quota_exceeded``) above one
    buyer's share of it."""

    window: int | None
    over: int
    reason: str = "privacy_window_full"


@dataclass(frozen=True, slots=True)
class Made(Generic[R]):
    """What a delivery's ``release`` made: the value's entry (new or retained), the levels it
    was released at, and the caller's result."""

    entry: ValueEntry
    levels: Iterable[float]
    result: R


Check = Callable[["PrivacyLedger", Spend], "Shortfall | None"]


def window_room(ledger: PrivacyLedger, spend: Spend) -> Shortfall | None:
    """The first window the spend would push over its cap (nothing new costs nothing)."""
    cap = ledger.window_cap_nanos
    if cap is None:
        return None
    sums = ledger.state.window_spent_nano
    for k in sorted(spend.added):
        over = sums.get(k, 0) + spend.added[k] - cap
        if spend.added[k] > 0 and over > 0:
            return Shortfall(k, over)
    return None


def reserved_room(ledger: PrivacyLedger, spend: Spend) -> Shortfall | None:
    """The first window the spend would push into the room that other buyers' reservations
    hold there (:mod:`.holds`; a delivery, made to no one buyer, sees every reservation's):
    a reservation's room counts as spent for everyone but its buyer."""
    cap = ledger.window_cap_nanos
    if cap is None:
        return None
    held = held_by_others(ledger.state.reservations, spend.buyer_id)
    if not held:
        return None
    sums = ledger.state.window_spent_nano
    for k in sorted(spend.added):
        over = sums.get(k, 0) + held.get(k, 0) + spend.added[k] - cap
        if spend.added[k] > 0 and over > 0:
            return Shortfall(k, over)
    return None


def buyer_share(ledger: PrivacyLedger, spend: Spend) -> Shortfall | None:
    """The stream's cap or first window a release at ``spend.level`` would take a buyer beyond
    its share of (streams with a ``buyer_share``; :mod:`.quotas`)."""
    share = ledger.share
    if share is None:
        return None
    counts = ledger.state.window_values if spend.fresh is None else spend.fresh
    ex = quotas.excess(share, spend.level.value, counts, spend.windows, spend.new_values)
    return None if ex is None else Shortfall(ex.window, ex.use - ex.limit, "buyer_quota_exceeded")


CHECKS: tuple[Check, ...] = (window_room, reserved_room, buyer_share)
"""Every check the gate runs on a spend, in order (the module docstring: adding one)."""


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # beyond year 9999: say it in milliseconds
        return f"{ms} ms"


def status(st: StreamState, idx: int) -> WindowStatus:
    """Window ``idx`` of a ``window`` stream as the ledger accounts it (levels as decimals)."""
    reg = st.registration
    assert reg.window is not None
    spent = st.window_spent_nano.get(idx, 0)
    w = reg.window.duration_ms
    return WindowStatus(
        start_ms=idx * w,
        end_ms=(idx + 1) * w,
        unit=UNIT_OF[reg.mechanism],
        cap=reg.window.cap,
        spent=level_of(spent),
        headroom=level_of(max(0, cap_of(reg.window.cap) - spent)),
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


@dataclass(slots=True)
class _Retained:
    """The retained values' losses per window, sorted, with prefix sums: what releasing a
    level on all of them adds to each window, in O(log n) per window."""

    losses: dict[int, list[int]] = field(default_factory=dict)
    prefix: dict[int, list[int]] = field(default_factory=dict)

    def counts(self) -> dict[int, int]:
        """How many retained values each window has."""
        return {k: len(losses) for k, losses in self.losses.items()}

    def added(self, nanos: int) -> dict[int, int]:
        out = {}
        for k, losses in self.losses.items():
            below = bisect_left(losses, nanos)
            if (a := below * nanos - self.prefix[k][below]) > 0:
                out[k] = a
        return out


class PrivacyLedger:
    """What one stream's releases have cost (see the module docstring); every write of a
    value's loss, the stream's spent, a window's sum or a charge goes through here.

    Parameters
    ----------
    state : StreamState
        The stream's record, whose ledger fields this writes.
    levels : sequence of float
        The levels for sale, in this stream's unit (what a refusal says still fits).
    changed : callable
        Called after every write (the stream is then saved at the end of the event).
    charged : list of str
        Where the buyers whose holdings changed are noted (the stream store saves them).
    """

    def __init__(
        self,
        state: StreamState,
        levels: Sequence[float],
        changed: Callable[[], None],
        charged: list[str],
    ) -> None:
        self.state = state
        self._levels = levels
        self._changed = changed
        self._charged = charged
        self.unit: Unit = UNIT_OF[state.registration.mechanism]
        window = state.registration.window
        self._duration = None if window is None else window.duration_ms
        #: the window cap in nano-units, rounded down (None: not a ``window`` stream)
        self.window_cap_nanos = None if window is None else cap_of(window.cap)
        #: one buyer's share of the caps (None: registered without one)
        self.share = quotas.share_of(state.registration)

    def level(self, value: float) -> Level:
        """``value`` as a level of this stream's unit."""
        return Level(float(value), self.unit)

    @property
    def windowed(self) -> bool:
        """Whether the stream accounts privacy per window."""
        return self._duration is not None

    def window_of(self, published_at_ms: int) -> int:
        """The index of the window a value published at ``published_at_ms`` belongs to."""
        assert self._duration is not None
        return published_at_ms // self._duration

    def shortfall(self, spend: Spend, checks: Sequence[Check] = CHECKS) -> Shortfall | None:
        """The first of ``checks`` the spend fails (all of :data:`CHECKS` unless told);
        ``None`` if it fits. Changes nothing."""
        for check in checks:
            if (short := check(self, spend)) is not None:
                return short
        return None

    # -- values ---------------------------------------------------------------------------------
    def check_open(self, published_at_ms: int, value_id: str) -> None:
        """Refuse (``privacy_window_closed``) a value whose window's sum was dropped: it would
        be counted from zero."""
        if self._duration is None:
            return
        idx = self.window_of(published_at_ms)
        if idx <= self.state.window_floor and idx not in self.state.window_spent_nano:
            ws = status(self.state, idx)
            raise Reject(
                "privacy_window_closed",
                f"value {value_id!r} was published in the privacy window {_iso(ws.start_ms)}–"
                f"{_iso(ws.end_ms)}, which the market no longer accounts (it keeps the windows "
                f"of the values it retains and up to {MAX_RECENT_WINDOWS} more that values can "
                "still join); publish values in order and on time",
            )

    def deliver(
        self,
        published_at_ms: int,
        current: Level,
        wanted: Iterable[Level],
        release: Callable[[frozenset[Level]], Made[R]],
        *,
        new: bool = False,
    ) -> R:
        """The gate of a value's deliveries: the ``wanted`` levels that fit, then
        ``release(fitting)``, then the value's loss, its window's sum, its window's count of
        values and the stream's spent.

        On a ``window`` stream the value's window is kept open even when nothing was released.

        Parameters
        ----------
        published_at_ms : int
            When the value was published (which window it spends in).
        current : Level
            The largest level it was released at so far (0 for a new value): levels up to it
            cost the window nothing and fit its cap, but still count against a buyer's share.
        wanted : iterable of Level
            The levels its holders hold.
        release : callable
            Makes the releases at the levels that fit (and, for a new value, its entry);
            whatever it raises, nothing has been recorded.
        new : bool
            A value just published: it joins its window's count of values (a value sent again
            is counted already).

        Returns
        -------
        R
            ``release``'s result.
        """
        fits = frozenset(
            lv for lv in wanted if self._fits_value(published_at_ms, current, lv, new=new)
        )
        made = release(fits)
        released = [self.level(lv) for lv in made.levels]
        if made.entry.published_at_ms != published_at_ms or any(
            lv not in fits and lv > current for lv in released
        ):
            raise AssertionError(f"released beyond what the ledger let through: {released}")
        self._commit_value(made.entry, max(released, default=current), new=new)
        return made.result

    def _fits_value(self, published_at_ms: int, current: Level, level: Level, *, new: bool) -> bool:
        if self._duration is None:
            return True
        k = self.window_of(published_at_ms)
        added = {k: level.nanos - current.nanos} if level > current else {}
        spend = Spend(level, added, windows=frozenset((k,)), new_values=int(new))
        return self.shortfall(spend) is None

    def over_share(self, level: float, window: int) -> bool:
        """Whether holders of ``level`` are beyond one buyer's share of ``window`` (after its
        newest value was counted): why a delivery to them was withheld. Changes nothing."""
        spend = Spend(self.level(level), {}, windows=frozenset((window,)))
        return self.shortfall(spend, (buyer_share,)) is not None

    def room(self, buyer_id: str, window: int) -> int | None:
        """The room, in nano-units, ``buyer_id`` may still use of ``window`` before its share
        is spent at the level it holds (``None``: no per-buyer limit on this stream's
        windows): what a reservation holding a buyer's room counts against."""
        holder = self.state.holders.get(buyer_id)
        held = 0.0 if holder is None else holder.level
        return quotas.room(self.share, held, self.state.window_values, window)

    def _commit_value(self, entry: ValueEntry, top: Level, *, new: bool) -> None:
        st = self.state
        current = self.level(entry.level)
        if self._duration is not None:
            idx = self.window_of(entry.published_at_ms)
            added = max(0, top.nanos - current.nanos)
            st.window_spent_nano[idx] = st.window_spent_nano.get(idx, 0) + added
            if new and self.share is not None:
                st.window_values[idx] = st.window_values.get(idx, 0) + 1
        if top > current:
            entry.level = top.value
        st.spent_nano = max(st.spent_nano, top.nanos)
        self._changed()

    def record_held_by_market(self, level: Level) -> None:
        """The market computed (and keeps to itself) a release at ``level``: a sealed stream's
        cap-level release, counted in the stream's spent (sealed streams have no windows)."""
        self.state.spent_nano = max(self.state.spent_nano, level.nanos)
        self._changed()

    # -- purchases ------------------------------------------------------------------------------
    def fitting_purchase(
        self,
        levels: Sequence[Level],
        checks: Sequence[Check] = CHECKS,
        *,
        fresh: bool = False,
        buyer_id: str | None = None,
    ) -> list[bool]:
        """Which of ``levels`` a purchase could release now on every retained value (each of
        ``checks``, all unless told, passes: all of them on other streams, or with no retained
        value), by a buyer that holds nothing yet if ``fresh``, and of ``buyer_id``'s (whose own
        reservation is room it may use) if given. Changes nothing."""
        retained = self._retained()
        windows = frozenset(retained.losses)
        counts = retained.counts() if fresh else None
        return [
            self.shortfall(
                Spend(lv, retained.added(lv.nanos), buyer_id, windows=windows, fresh=counts),
                checks,
            )
            is None
            for lv in levels
        ]

    def sell(self, buyer_id: str, level: Level, price_minor: int, release: Callable[[], R]) -> R:
        """The gate of a purchase: check, release, then record the spend and the charge.

        Parameters
        ----------
        buyer_id : str
            Who buys (their holding becomes ``level``).
        level : Level
            The level released on every retained value.
        price_minor : int
            What the step costs, added to what the buyer paid and to the stream's revenue.
        release : callable
            Makes the releases and the outcome; called only if every check passed, and
            whatever it raises, nothing has been recorded.

        Returns
        -------
        R
            ``release``'s result.

        Raises
        ------
        Reject
            ``privacy_window_full`` if releasing ``level`` would overspend a window, or
            ``buyer_quota_exceeded`` if it would take the buyer beyond its share: by how much,
            what fits and when it frees (``release`` is not called).
        """
        spend = self._purchase(buyer_id, level, price_minor)
        result = release()
        self._commit(spend)
        return result

    def hold(self, buyer_id: str, level: Level, price_minor: int) -> dict[int, int]:
        """What a reservation of ``buyer_id``'s purchase of ``level`` holds: window index →
        what the purchase would add there (nano-units), if every check would let it through
        now; else the purchase's refusal. Records nothing (the reservation is kept by
        :mod:`.reserving`)."""
        return dict(self._purchase(buyer_id, level, price_minor).added)

    def _purchase(self, buyer_id: str, level: Level, price_minor: int) -> Spend:
        """The spend of ``buyer_id``'s purchase of ``level`` on every retained value, if every
        check lets it through now; else its refusal (raised). The one spend a sale and a
        reservation are both judged by."""
        retained = self._retained()
        spend = Spend(
            level,
            retained.added(level.nanos),
            buyer_id,
            price_minor,
            windows=frozenset(retained.losses),
            fresh=None if buyer_id in self.state.holders else retained.counts(),
        )
        short = self.shortfall(spend)
        if short is not None:
            raise self._refusal(spend, short)
        return spend

    def _commit(self, spend: Spend) -> None:
        """Record a purchase that passed the gate: every value below to its level, every
        window by what the spend adds, the holding and the charge (computed first, then
        assigned)."""
        st = self.state
        level, buyer = spend.level, spend.buyer_id
        assert buyer is not None
        old = st.holders.get(buyer) or Holder(level=level.value)
        # a new Holder, never the old one changed: a holders base may share the old one
        holder = Holder(
            level=level.value,
            paid_minor=old.paid_minor + spend.price_minor,
            purchases=old.purchases + 1,
        )
        sums = {k: st.window_spent_nano.get(k, 0) + a for k, a in spend.added.items()}
        for e in st.window:
            e.level = max(e.level, level.value)
        st.window_spent_nano.update(sums)
        if st.window:
            st.spent_nano = max(st.spent_nano, level.nanos)
        st.holders[buyer] = holder
        st.revenue_minor += spend.price_minor
        consume(st.reservations, buyer)  # its room is now this spend (any purchase uses it)
        self._charged.append(buyer)
        self._changed()

    def _refusal(self, spend: Spend, short: Shortfall) -> Reject:
        """``privacy_window_full`` (or ``buyer_quota_exceeded``): the window (or share) that
        has no room, what fits and when it frees."""
        st = self.state
        sellable = [self.level(lv) for lv in self._levels]
        ok = self.fitting_purchase(sellable, fresh=spend.fresh is not None, buyer_id=spend.buyer_id)
        fits = [lv for lv, fit in zip(sellable, ok, strict=True) if fit]
        if short.reason == "buyer_quota_exceeded":
            assert self.share is not None
            windows = () if short.window is None else (short.window,)
            counts = st.window_values if spend.fresh is None else spend.fresh
            ex = quotas.excess(self.share, spend.level.value, counts, windows)
            assert ex is not None
            ws = None if ex.window is None else status(st, ex.window)
            holder = st.holders.get(spend.buyer_id or "")
            above = [lv.value for lv in fits if holder is None or lv.value > holder.level]
            return quotas.refusal(st.registration, ex, ws, max(above, default=None))
        assert short.window is not None
        ws = status(st, short.window)
        n = sum(1 for e in st.window if self.window_of(e.published_at_ms) == short.window)
        best = (
            f"the most accurate level that fits now is {max(fits).value:g}"
            if fits
            else "no level fits now"
        )
        added = level_of(spend.added[short.window])
        return Reject(
            "privacy_window_full",
            f"releasing the level asked for on the {n} values of this stream's {describe(ws)} "
            f"would spend {added:g} more{held_note(st.reservations, short.window, spend.buyer_id)}"
            f"; {best}. New "
            "values count against the next "
            f"window from {_iso(ws.end_ms)}; this window's values stop being covered by "
            f"purchases once {st.registration.retain_last} newer values have arrived",
            window=ws.model_dump(),
            best_level=max(fits).value if fits else None,
        )

    def _retained(self) -> _Retained:
        """The retained values' losses per window (none on an ``event`` stream)."""
        out = _Retained()
        duration = self._duration
        if duration is None:
            return out
        levels: dict[int, list[float]] = {}
        for e in self.state.window:
            levels.setdefault(e.published_at_ms // duration, []).append(e.level)
        for k, window in levels.items():
            window.sort()  # spend_of is monotone: the losses come out sorted
            out.losses[k] = losses = [spend_of(lv) for lv in window]
            out.prefix[k] = [0, *accumulate(losses)]
        return out

    # -- upkeep ---------------------------------------------------------------------------------
    def prune(self, horizon_ms: int) -> None:
        """Drop sums no release can change any more; beyond that keep the newest
        :data:`~streams.core.state.MAX_RECENT_WINDOWS`, closing older ones."""
        st = self.state
        if self._duration is None:
            return
        sums = st.window_spent_nano
        joinable = max(0, st.watermark_ms - horizon_ms) // self._duration  # none can join below
        if len(sums) <= MAX_RECENT_WINDOWS and min(sums, default=joinable) >= joinable:
            return  # nothing to drop (the usual case: one pass over the few sums, not the window)
        retained = {self.window_of(e.published_at_ms) for e in st.window}
        recent = sorted(k for k in sums if k not in retained and k >= joinable)
        dropped = [k for k in sums if k not in retained and k < joinable]
        dropped += recent[: max(0, len(recent) - MAX_RECENT_WINDOWS)]
        for k in dropped:
            del sums[k]
            st.window_values.pop(k, None)
            st.window_floor = max(st.window_floor, k)
        self._changed()
