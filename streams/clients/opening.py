"""Opening the sealed releases of one inbox, read in order, with every sealing key a party holds.

The market seals a release to the sealing key the account has when it seals it; after
``account rotate`` the records before the rotation stay sealed to the old key. An inbox carries
the account's keys as the market knows them (``account`` events, one per opening and rotation),
so a reader that follows them knows, for a record it cannot open, which key version it was
sealed under and can say so: the person then passes that version's key file. Nothing here
raises for a record that does not open: the rest of the inbox is still read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from market.envelope import EnvelopeError

from ..wire.events import AccountState, InboxEvent, PurchaseFulfilled, ValueReleased
from ..wire.sealing import open_event
from .keys import SealingKey

__all__ = ["InboxOpener", "Unopened"]


@dataclass(frozen=True)
class Unopened:
    """A sealed record none of the given keys opens, and why.

    ``key_version``, ``key_id`` and ``sealing_key`` are the account's keys when the record
    reached the inbox (its last ``account`` event before it; None if there was none): the
    version whose key file opens it, but for a record sealed in the moment of a rotation.
    ``held`` says whether one of the given keys is that version's sealing key.
    """

    event: PurchaseFulfilled | ValueReleased
    key_version: int | None
    key_id: str | None
    sealing_key: str | None
    held: bool
    reason: str


class InboxOpener:
    """Opens the sealed records of one inbox with ``keys`` (the current key first, then older
    ones), following the inbox's ``account`` events to explain what it cannot open."""

    def __init__(self, keys: Sequence[SealingKey]) -> None:
        self.keys = list(keys)
        self.state: AccountState | None = None
        self.unopened: list[Unopened] = []

    def open(self, ev: InboxEvent) -> InboxEvent | Unopened:
        """``ev`` with its releases opened, or an :class:`Unopened` saying why they are not
        (also kept in :attr:`unopened`); an ``account`` event updates the keys followed."""
        if isinstance(ev, AccountState):
            self.state = ev
        if not isinstance(ev, PurchaseFulfilled | ValueReleased) or ev.sealed is None:
            return ev
        for k in self._tried_first():
            try:
                return open_event(ev, k.key)
            except EnvelopeError:
                continue
        out = self._unopened(ev)
        self.unopened.append(out)
        return out

    def _tried_first(self) -> list[SealingKey]:
        """The keys, the one the account now seals to first (most records open with it)."""
        now = None if self.state is None else self.state.sealing_key
        return sorted(self.keys, key=lambda k: k.public_key != now)

    def _unopened(self, ev: PurchaseFulfilled | ValueReleased) -> Unopened:
        st = self.state
        held = st is not None and any(k.public_key == st.sealing_key for k in self.keys)
        what = "its releases are sealed"
        if not self.keys:
            why = f"{what}, and the key files given hold no sealing key (keygen --no-sealing)"
        elif st is None:
            why = f"{what} to a key none of the key files given holds"
        elif not held:
            why = (
                f"{what} to the account's keys of version {st.version} (key id {st.key_id}), "
                "which none of the key files given holds"
            )
        else:
            versions = ", ".join(str(k.version) for k in sorted(self.keys, key=lambda k: k.version))
            why = (
                f"{what}, and open with none of the sealing keys given (versions {versions}), "
                f"though the account was at version {st.version}: sealed to another version's "
                "key in the moment of a rotation, or altered"
            )
        return Unopened(
            ev,
            None if st is None else st.version,
            None if st is None else st.key_id,
            None if st is None else st.sealing_key,
            held,
            why,
        )
