"""Per-buyer quotas: one buyer's share of a stream's cap and of each privacy window's cap.

A seller registers a stream with ``buyer_share`` s, a fraction in (0, 1], so that no one buyer
can spend what all buyers share: the stream's cap C, and on a ``window`` stream each window's
cap C_w (docs/protocol.md §6.3.1). The ledger runs these checks inside its one gate, with its
others; this module computes, and changes nothing.

**What a buyer uses.** Of the stream: the level it holds (releases are lossless, so what a buyer
has learned of a value is the largest level released to it, and it never holds less than it
was released). Of window k: its level L times n_k, the number of values published into k so
far. Every release to a buyer is at most the level it holds, and it has had at most n_k of the
window's values, so by composition L·n_k bounds what it has learned of the window: it is
exact for a buyer that held L since the window began (a subscriber), and over-counts for one
that joined later (such a buyer gets fewer of the window's values than its share would allow,
never more). A buyer that holds nothing has been released nothing, so its first purchase is
counted with the retained values it is about to get instead of n_k. The figure needs no state
per buyer: one count per window, kept and dropped with the window's sum by the ledger
(``StreamRecord.window_values``, written there alone), so no holder's record is rewritten for
every value; and it depends on the level alone, so the limit on deliveries is per level, like
the window's own: at level L, a buyer gets at most ⌊share/L⌋ values of one window.

**Integers.** In the ledger's nano-units (:mod:`market.privacy_units`): a share is
⌊s·⌊C⌋⌋ with s read from its canonical decimal (a share is a cap: rounded down), and a use is
``spend_of(L)·n`` (a spend: rounded up). So a share of 0.1 of a cap of 1 holds exactly ten
values at 0.01.

**Checks.** A purchase at L by a buyer fits if ``spend_of(L)`` is at most the share of C, and
``spend_of(L)·n_k`` at most the share of C_w for every window k of the values it covers (a
buyer holding nothing: the retained values of k instead of n_k). A new
value of window k reaches the holders of L if ``spend_of(L)·(n_k + 1)`` is at most the share
of C_w (a value sent again: ``spend_of(L)·n_k``, it is counted already); the others are told
(``deliveries_withheld``, reason ``buyer_quota_exceeded``). A purchase beyond the share is
refused (``buyer_quota_exceeded``) with the most accurate level that fits and when the window
frees.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

from market.privacy_units import cap_of, level_of, spend_of

from ..wire.events import StreamRegistration, WindowStatus
from ..wire.times import utc_text
from .outputs import Reject

__all__ = [
    "Excess",
    "Share",
    "check_registration",
    "excess",
    "refusal",
    "room",
    "share_of",
    "values_allowed",
    "withheld_text",
]


@dataclass(frozen=True, slots=True)
class Share:
    """One buyer's share of a stream's caps, in nano-units.

    Attributes
    ----------
    fraction : float
        The registration's ``buyer_share``.
    of_cap : int
        The most level one buyer may hold: ⌊fraction·⌊cap⌋⌋.
    of_window : int or None
        The most one buyer may use of one window: ⌊fraction·⌊window cap⌋⌋ (``None`` on an
        ``event`` stream).
    """

    fraction: float
    of_cap: int
    of_window: int | None


@dataclass(frozen=True, slots=True)
class Excess:
    """Why a release at ``level`` goes beyond a buyer's share: the buyer would use ``use``
    nano-units of window ``window`` (``None``: of the stream's cap, ``use`` is then the level)
    where its share is ``limit``."""

    level: float
    window: int | None
    use: int
    limit: int


def _part(fraction: float, cap: float) -> int:
    """⌊fraction·⌊cap⌋⌋ nano-units, the fraction read from its canonical decimal."""
    # exact rationals: a Decimal product rounds to 28 digits, which a 17-digit share times a
    # cap of 10¹² nano-units and more exceeds (rounding up before the floor)
    return math.floor(Fraction(Decimal(repr(float(fraction)))) * cap_of(cap))


@lru_cache(maxsize=1024)
def _share(fraction: float, cap: float, window_cap: float | None) -> Share:
    return Share(
        fraction, _part(fraction, cap), None if window_cap is None else _part(fraction, window_cap)
    )


def share_of(reg: StreamRegistration) -> Share | None:
    """The per-buyer share of a stream (``None``: registered without one)."""
    if reg.buyer_share is None:
        return None
    return _share(reg.buyer_share, reg.cap, None if reg.window is None else reg.window.cap)


def excess(
    share: Share, level: float, counts: Mapping[int, int], windows: Iterable[int], new: int = 0
) -> Excess | None:
    """How a release at ``level`` to one buyer goes beyond its ``share``, or ``None`` if it
    fits: first the stream's cap, then each of ``windows`` in order, window k counting
    ``counts[k] + new`` values (``new``: values the release adds to the count, 1 for a value
    just published). A level of nothing uses nothing."""
    nanos = spend_of(level)
    if nanos == 0:
        return None
    if nanos > share.of_cap:
        return Excess(level, None, nanos, share.of_cap)
    if share.of_window is None:
        return None
    for k in sorted(windows):
        use = nanos * (counts.get(k, 0) + new)
        if use > share.of_window:
            return Excess(level, k, use, share.of_window)
    return None


def values_allowed(share: Share, level: float) -> int | None:
    """How many values of one window a buyer at ``level`` may get (``None``: no limit)."""
    nanos = spend_of(level)
    if share.of_window is None or nanos == 0:
        return None
    return share.of_window // nanos


def room(share: Share | None, held: float, counts: Mapping[int, int], window: int) -> int | None:
    """The room, in nano-units, a buyer holding ``held`` may still use in ``window`` before its
    share is spent (``None``: no per-buyer limit on this stream's windows); what a reservation
    holding a buyer's room counts against."""
    if share is None or share.of_window is None:
        return None
    return max(0, share.of_window - spend_of(held) * counts.get(window, 0))


def refusal(
    reg: StreamRegistration,
    ex: Excess,
    ws: WindowStatus | None,
    best: float | None,
) -> Reject:
    """``buyer_quota_exceeded``: which cap, what the buyer would use, its share, the most
    accurate level above what it holds that fits now (``best``) and, for a window (``ws``),
    when it frees."""
    share = reg.buyer_share
    assert share is not None
    fits = f"the most accurate level that fits now is {best:g}" if best is not None else ""
    fits = fits or "no level above what you hold fits now"
    if ex.window is None or ws is None or reg.window is None:
        what = (
            f"level {ex.level:g} is above one buyer's share of this stream's cap: at most "
            f"{level_of(ex.limit):g} ({share * 100:g} % of {reg.cap:g})"
        )
        when = ""
    else:
        n = ex.use // spend_of(ex.level)
        what = (
            f"at level {ex.level:g} you would use {level_of(ex.use):g} {ws.unit} of the "
            f"privacy window {utc_text(ws.start_ms)}–{utc_text(ws.end_ms)} ({n} values at "
            f"{ex.level:g}), but one buyer may use at most {level_of(ex.limit):g} "
            f"({share * 100:g} % of its cap {reg.window.cap:g})"
        )
        when = (
            f". Values published from {utc_text(ws.end_ms)} count against the next window; this "
            f"window's values stop being covered by purchases once {reg.retain_last} newer "
            "values have arrived"
        )
    return Reject(
        "buyer_quota_exceeded",
        f"{what}; {fits}{when}",
        buyer_share=share,
        limit=level_of(ex.limit),
        would_use=level_of(ex.use),
        window=None if ws is None or ex.window is None else ws.model_dump(),
        best_level=best,
    )


def check_registration(reg: StreamRegistration) -> None:
    """Refuse (``invalid_event``) a share that leaves one buyer less than the lowest step: no
    buyer could buy anything. (A window's cap is at least the stream's, so its share is too.)"""
    share = share_of(reg)
    if share is None or spend_of(reg.steps[0]) <= share.of_cap:
        return
    raise Reject(
        "invalid_event",
        f"buyer_share {share.fraction:g} leaves one buyer {level_of(share.of_cap):g} of the "
        f"stream's cap {reg.cap:g}, less than the lowest step {reg.steps[0]:g}: no buyer could "
        "buy anything; raise --buyer-share or --cap, or lower the first of --steps",
    )


def withheld_text(stream_id: str, share: Share, level: float, ws: WindowStatus) -> str:
    """What a holder is told of values withheld for its share: how many values of a window its
    level allows, and when values reach it again."""
    n = values_allowed(share, level)
    return (
        f"values of stream {stream_id!r} withheld from you: one buyer may use at most "
        f"{level_of(share.of_window or 0):g} {ws.unit} of each privacy window "
        f"({share.fraction * 100:g} % of its cap), which at your level {level:g} is {n} "
        f"values of a window. Values published from {utc_text(ws.end_ms)} (the next window) "
        "reach you again; a lower level gets more values of each window"
    )
