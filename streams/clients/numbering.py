"""A seller's numbering of its value batches, per stream (docs/protocol.md §6.4.1).

The market recognises a numbered batch sent again by its number alone, however many values
came since, and answers it as it answered it first. So a number must name one batch: a number
is used again only once the market said it did not take it (a batch refused, whole or in
part), never while its batch may still be taken (sent, and no answer yet).

The numbering is learnt from the market, not kept on disk: a process starts each stream with
batches numbered 0 (applied unnumbered, as a version 1 client's), and the first answer to one
says where the stream's numbering stands: the number after the highest it applied, and the
numbers below it no batch took (those of batches lost with an earlier process), which are used
first. A batch numbered too far ahead (``batch_seq_out_of_window``) says the same in its
refusal. Every batch of an earlier process was written to the stream's partition before the
new process's first batch, so the market has read it by the time it answers that one: a number
it says is free is free. Two processes publishing one stream at once would number alike; one
seller publishes each stream from one process at a time.

A market of an earlier version refuses the field (``invalid_event`` naming ``batch_seq``): the
stream's batches then go unnumbered, as they did before.
"""

from __future__ import annotations

from typing import Any

from ..wire.events import Rejection, ValuesAccepted

__all__ = ["OUT_OF_WINDOW", "Numbering"]

OUT_OF_WINDOW = "batch_seq_out_of_window"
"""The refusal of a number too far above what the stream applied; its details say where the
numbering stands."""


class _Stream:
    """One stream's numbering as this process knows it."""

    def __init__(self, following: int, free: list[int]) -> None:
        self.following = following
        """The number after every number this process used or the market named."""
        self.free = set(free)
        """Numbers below it that no batch took and no batch of this process holds."""
        self.held: set[int] = set()
        """Numbers of batches sent and not answered yet."""


class Numbering:
    """The numbers of a seller's value batches on each stream: :meth:`take` one for a batch,
    :meth:`settle` it with the market's answer."""

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self._unnumbered: set[str] = set()
        """Streams of a market that does not number batches."""

    def take(self, stream_id: str) -> int | None:
        """The number of the next batch of ``stream_id``: 0 until the market said where the
        numbering stands, then the lowest number free (None: the market numbers none)."""
        if stream_id in self._unnumbered:
            return None
        s = self._streams.get(stream_id)
        if s is None:
            return 0
        if s.free:
            n = min(s.free)
            s.free.discard(n)
        else:
            n, s.following = s.following, s.following + 1
        s.held.add(n)
        return n

    def settle(
        self, stream_id: str, n: int | None, answer: ValuesAccepted | Rejection | None
    ) -> bool:
        """The batch numbered ``n`` of ``stream_id`` (None: unnumbered) was answered
        (``answer`` None: it was sent without waiting, or no answer came; its number is then
        never used again, since the market may have taken it). Whether to send the batch
        again numbered anew: its number was out of the window, or the market numbers none."""
        if n == 0 and _unknown_field(answer):
            self._unnumbered.add(stream_id)
            return True
        s = self._streams.get(stream_id)
        if n is None or n == 0:
            if s is None and isinstance(answer, ValuesAccepted) and answer.next_batch_seq:
                self._streams[stream_id] = _Stream(
                    answer.next_batch_seq, answer.missing_batch_seqs or []
                )
            return False
        if s is None or n not in s.held:
            return False
        s.held.discard(n)
        if isinstance(answer, Rejection) and answer.reason == OUT_OF_WINDOW:
            self._learn(s, answer.details)
            return True
        if answer is not None and not _taken(answer):
            s.free.add(n)
        return False

    @staticmethod
    def _learn(s: _Stream, details: dict[str, Any]) -> None:
        """Go on from where the market says the numbering stands."""
        missing = details.get("missing") or []
        s.free |= {m for m in missing if isinstance(m, int) and m > 0} - s.held
        following = details.get("next")
        if isinstance(following, int):
            s.following = max(s.following, following)


def _unknown_field(answer: ValuesAccepted | Rejection | None) -> bool:
    """Whether ``answer`` is a market of an earlier version refusing the field."""
    return (
        isinstance(answer, Rejection)
        and answer.reason == "invalid_event"
        and "batch_seq" in answer.message
    )


def _taken(answer: ValuesAccepted | Rejection) -> bool:
    """Whether the market took the batch's number: it applied every value of it."""
    return isinstance(answer, ValuesAccepted) and all(
        o.status == "accepted" for o in answer.outcomes
    )
