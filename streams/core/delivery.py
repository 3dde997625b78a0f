"""Subscription deliveries: every new value, at the level each holder holds, to its inbox.

A value queues one release per holder of its stream; :meth:`Deliveries.drain` turns the queue
into ``value_released`` events per (buyer, stream), sealed for the buyer account's current
sealing key when it has one, and split so that no message exceeds the broker's size limit.
A value a ``window`` stream's privacy window has no room for at a holder's level is withheld
from that holder, who gets a ``deliveries_withheld`` event instead (never silence).
Inside :meth:`Deliveries.batch` nothing is drained per event, so the releases of a whole batch
reach each buyer in as few messages as the limit allows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from numpy.typing import NDArray

from market.envelope import Sealer

from ..wire.events import UNIT_OF, DeliveriesWithheld, ReleasedValue, ValueReleased
from ..wire.sealing import delivery_aad, seal_releases
from ..wire.topics import Topics
from ..wire.trusted import trusted
from .accuracy import error_info
from .directory import Directory
from .holds import held_note
from .ledger import describe, status
from .outputs import HeldForBatch, Output, dump
from .quotas import share_of, withheld_text
from .state import StreamState

__all__ = ["BYTES_PER_NUMBER", "Deliveries", "Listed", "Release", "release_bytes"]

Release = NDArray[Any] | tuple[NDArray[Any], NDArray[Any]]
"""One value released at one level: its numbers, or a histogram's (keys, noisy counts)."""
Listed = tuple[list[float], list[str] | None]
"""A release as JSON-ready lists, as its product lists it
(:meth:`~streams.core.products.base.Product.listed`): its numbers, and its keys if it has any."""


def _runs_of_one_level(releases: list[ReleasedValue]) -> list[list[ReleasedValue]]:
    """Consecutive releases at the same level (a purchase in the batch moves the level)."""
    runs: list[list[ReleasedValue]] = []
    for r in releases:
        if runs and runs[-1][0].level == r.level:
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


log = logging.getLogger("emarket.core")


def _never(level: float) -> bool:
    return False


WITHHELD_NOTICE_BYTES = 1024
"""Upper bound on a ``deliveries_withheld`` notice without its value ids (ids, window
figures, message with 64-character ids: about 870 bytes)."""

BYTES_PER_NUMBER = 26
"""Most bytes one released number takes in JSON (``-1.2345678901234567e-308,``)."""


def release_bytes(dimension: int, sealed: bool) -> int:
    """An upper bound on the bytes one released vector adds to a message."""
    raw = dimension * BYTES_PER_NUMBER + 160
    return raw * 4 // 3 + 8 if sealed else raw


class Deliveries(HeldForBatch):
    """Releases waiting to be delivered, grouped by (buyer, stream)."""

    def __init__(
        self, topics: Topics, sealer: Sealer, directory: Directory, max_message_bytes: int
    ) -> None:
        self._topics = topics
        self._sealer = sealer
        self._directory = directory
        self._pending: dict[tuple[str, str], list[ReleasedValue]] = {}
        #: the record of every stream with something queued, as it was when it was queued
        self._streams: dict[str, StreamState] = {}
        #: (buyer, stream, window index, level held, reason) → value ids withheld
        self._withheld: dict[tuple[str, str, int, float, str], list[str]] = {}
        super().__init__()
        self.max_message_bytes = max_message_bytes
        #: an upper bound on the bytes of everything queued (the worker cuts batches by it)
        self.pending_bytes = 0
        #: deliveries withheld so far (monotonic: handlers count theirs by difference), and of
        #: those for a buyer's share (:mod:`.quotas`)
        self.withheld_total = 0
        self.quota_withheld_total = 0

    def queue(
        self,
        st: StreamState,
        value_id: str,
        seq: int,
        by_level: Mapping[float, Listed],
        terms: int | None = None,
    ) -> int:
        """Queue ``value_id``'s release for each holder whose level is in ``by_level`` (listed
        by its product); return how many."""
        sid = st.registration.stream_id
        self._streams[sid] = st
        # one release per level, shared by the holders of that level (never changed after)
        made = {}
        for lvl, (values, keys) in by_level.items():
            made[lvl] = trusted(
                ReleasedValue,
                value_id=value_id,
                seq=seq,
                level=lvl,
                values=values,
                terms=terms,
                keys=keys,
            )
        self.pending_bytes += len(st.holders) * release_bytes(st.registration.release_width(), True)
        queued = 0
        for buyer, holder in st.holders.items():
            release = made.get(holder.level)
            if release is None:  # withheld (see :meth:`withhold`)
                continue
            self._pending.setdefault((buyer, sid), []).append(release)
            queued += 1
        return queued

    def withhold(
        self,
        st: StreamState,
        value_id: str,
        window: int,
        released: set[float],
        over_share: Callable[[float], bool] = _never,
    ) -> None:
        """Note that ``value_id`` (of privacy window ``window``) is withheld from every holder
        whose level is not in ``released``: for the buyer's share where ``over_share(level)``,
        else for the window's cap."""
        sid = st.registration.stream_id
        self._streams[sid] = st
        for buyer, holder in st.holders.items():
            if holder.level not in released:
                quota = over_share(holder.level)
                reason = "buyer_quota_exceeded" if quota else "privacy_window_full"
                self.quota_withheld_total += quota
                group = (buyer, sid, window, holder.level, reason)
                if group not in self._withheld:  # a notice of its own: window, message, ids
                    self._withheld[group] = []
                    self.pending_bytes += WITHHELD_NOTICE_BYTES
                self._withheld[group].append(value_id)
                self.pending_bytes += 67  # a quoted 64-character id and its comma
                self.withheld_total += 1

    def drain(self) -> list[Output]:
        """``value_released`` events for everything queued, each under the size limit.

        One holder's delivery failing (it cannot: sealing keys are validated when accepted,
        but if it did) costs only that holder's messages of this batch, logged; the queue is
        always emptied, so nothing of it leaks into the next batch.
        """
        outputs: list[Output] = []
        streams = self._streams
        try:
            for (buyer, sid), releases in self._pending.items():
                try:
                    outputs += self._messages(buyer, streams[sid], releases)
                except Exception:
                    log.exception(
                        "could not deliver %d releases of %s to %s", len(releases), sid, buyer
                    )
            for (buyer, sid, window, level, reason), ids in self._withheld.items():
                try:
                    st = streams[sid]
                    outputs += self._withheld_messages(buyer, st, window, level, reason, ids)
                except Exception:
                    log.exception(
                        "could not tell %s of %d values of %s withheld", buyer, len(ids), sid
                    )
        finally:
            self._pending.clear()
            self._withheld.clear()
            self._streams = {}
            self.pending_bytes = 0
        return outputs

    def _withheld_messages(
        self,
        buyer: str,
        st: StreamState,
        window: int,
        level: float,
        reason: str,
        ids: list[str],
    ) -> list[Output]:
        """``deliveries_withheld`` events for the values of one window, under the size limit."""
        ws = status(st, window)
        sid = st.registration.stream_id
        share = share_of(st.registration)
        if reason == "buyer_quota_exceeded" and share is not None:
            message = withheld_text(sid, share, level, ws)
        else:
            message = (
                f"values of stream {sid!r} withheld from you: releasing them at your level "
                f"{level:g} {ws.unit} would overspend its {describe(ws)}"
                f"{held_note(st.reservations, window, None)}. Values published in the next "
                "window reach you again; the seller caps what the values of one window may "
                "reveal together"
            )
        room = max(1, (self.max_message_bytes - 4096) // 67)  # a quoted 64-character id
        out = []
        for start in range(0, len(ids), room):
            chunk = ids[start : start + room]
            event = DeliveriesWithheld(
                buyer_id=buyer,
                stream_id=sid,
                reason=reason,
                level=level,
                value_ids=chunk,
                window=ws,
                message=message,
            )
            out.append(Output(self._topics.inbox(buyer), chunk[-1].encode(), dump(event)))
        return out

    def _messages(self, buyer: str, st: StreamState, releases: list[ReleasedValue]) -> list[Output]:
        reg = st.registration
        account = self._directory.get(buyer)
        key = None if account is None else account.sealing_key
        per = release_bytes(reg.release_width(), key is not None)
        room = max(1, (self.max_message_bytes - 2048) // per)
        out = []
        for run in _runs_of_one_level(releases):  # one event, one level, one error model
            for start in range(0, len(run), room):
                out.append(self._event(buyer, reg, run[start : start + room], key))
        return out

    def _event(self, buyer: str, reg: Any, chunk: list[ReleasedValue], key: str | None) -> Output:
        sid = reg.stream_id
        sealed = None
        if key is not None:
            sealed = seal_releases(self._sealer, key, chunk, delivery_aad(sid, buyer))
        event = trusted(
            ValueReleased,
            buyer_id=buyer,
            stream_id=sid,
            level_unit=UNIT_OF[reg.mechanism],
            releases=[] if sealed else chunk,
            sealed=sealed,
            error_model=error_info(reg, chunk[0].level),
        )
        return Output(self._topics.inbox(buyer), chunk[-1].value_id.encode(), dump(event))
