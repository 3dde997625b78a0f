"""A stream as one event sees it: its record, its terms, what it sells and its privacy ledger.

:class:`Stream` is loaded once per event (:class:`streams.core.stream_store.Streams`) and saved
in one place, at the end of the event, if anything changed it. Everything that changes a
stream's record goes through here or its :class:`~streams.core.ledger.PrivacyLedger` (the one
writer of spends and charges), which mark it changed; the record is never written to its store
anywhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from market.privacy_units import level_of

from ..wire.events import UNIT_OF, StreamRegistration, ValueItem
from .ledger import Level, PrivacyLedger, latest_status
from .outputs import StreamFigures
from .state import StreamState, ValueEntry
from .terms import Terms

__all__ = ["Stream"]

P = TypeVar("P")


@dataclass(eq=False)
class Stream(Generic[P]):
    """One stream: its stored record (``state``), its terms, its product (``P``: what it sells,
    :mod:`streams.core.products`) and its ledger.

    Attributes
    ----------
    changed : bool
        Whether this event changed the record (it is then saved when the event ends).
    charged : list of str
        The buyers whose holdings this event changed, noted by the ledger (a stored record
        carries only the holders changed since its holders base: :mod:`streams.core.stream_store`).
    """

    state: StreamState
    terms: Terms
    product: P
    changed: bool = False
    charged: list[str] = field(default_factory=list)
    #: the stream's id and registration (fixed for good when it was registered)
    id: str = field(init=False)
    registration: StreamRegistration = field(init=False)
    ledger: PrivacyLedger = field(init=False)

    def __post_init__(self) -> None:
        self.registration = self.state.registration
        self.id = self.registration.stream_id
        self.ledger = PrivacyLedger(self.state, self.terms.levels, self.touch, self.charged)

    def touch(self) -> None:
        """Note that the record changed (saved when the event ends)."""
        self.changed = True

    def figures(self) -> StreamFigures:
        """The stream's ledger figures for the worker's gauges."""
        reg = self.state.registration
        ws = latest_status(self.state)
        return StreamFigures(
            reg.stream_id,
            reg.mechanism,
            UNIT_OF[reg.mechanism],
            level_of(self.state.spent_nano),
            reg.cap,
            reg.currency,
            None if ws is None else ws.spent,
            None if ws is None else ws.cap,
            None if ws is None else ws.headroom,
        )

    # -- holders --------------------------------------------------------------------------------
    def held(self, buyer_id: str) -> float:
        """The level ``buyer_id`` holds (0 if none)."""
        holder = self.state.holders.get(buyer_id)
        return holder.level if holder else 0.0

    def held_levels(self) -> set[Level]:
        """The levels the stream's holders hold."""
        return {self.ledger.level(h.level) for h in self.state.holders.values()}

    # -- the window of retained values ----------------------------------------------------------
    def entry(self, value_id: str) -> ValueEntry | None:
        """The retained value ``value_id``, if it is in the window."""
        return next((e for e in self.state.window if e.value_id == value_id), None)

    def append(self, item: ValueItem, digest: str, received_at_ms: int) -> ValueEntry:
        """Add a value to the window (newest last), numbered by its arrival; its loss is
        recorded by the ledger once it is released."""
        st = self.state
        entry = ValueEntry(
            value_id=item.value_id,
            seq=st.next_seq,
            digest=digest,
            received_at_ms=received_at_ms,
            published_at_ms=item.published_at_ms,
            level=0.0,
        )
        st.window.append(entry)
        st.next_seq += 1
        st.values_ingested += 1
        self.touch()
        return entry

    def evict(self) -> list[ValueEntry]:
        """Drop the values beyond the newest ``retain_last``; return them, oldest first."""
        st = self.state
        excess = len(st.window) - st.registration.retain_last
        if excess <= 0:
            return []
        gone, st.window = st.window[:excess], st.window[excess:]
        self.touch()
        return gone

    def keep_only(self, entries: list[ValueEntry]) -> None:
        """Replace the window by ``entries`` (a subset of it, in order)."""
        if len(entries) != len(self.state.window):
            self.state.window = entries
            self.touch()

    @contextlib.contextmanager
    def showing(self, entries: list[ValueEntry]) -> Iterator[None]:
        """Show only ``entries`` (retained values) as the window inside the block, then the
        window as it was: a past purchase's releases are recomputed over the values it
        covered, and the record is left as it was."""
        st = self.state
        window = st.window
        st.window = entries
        try:
            yield
        finally:
            st.window = window
