"""Numbered value batches: which of a seller's batches a stream has applied, in constant space.

A seller numbers its ``values`` batches per stream 1, 2, 3, … (docs/protocol.md §6.4.1), as
Kafka's idempotent producer numbers its batches. The stream keeps a watermark ``through`` (every
number up to it was applied) and the numbers applied above it, at most
:data:`~streams.core.state.BATCH_WINDOW` beyond it, so its record is the same size at one
batch a day or a thousand a second, and a resend is recognised by its number however many
values came since: unlike a value's mark (:mod:`.records`), a number is never forgotten.

A batch numbered 0 takes no number: it is applied as an unnumbered one, and its answer says
where the numbering stands (:func:`standing`), which is how a seller's new process learns it.
A number is taken only by a batch whose every value is in the stream (:func:`take`), so the
answer to a numbered batch applied is a pure function of its bytes (every line ``accepted``)
and is recomputed, byte for byte, for any resend. A batch refused, whole or in part, takes no
number: its seller numbers its next batch with it, or sends it again once fixed.
"""

from __future__ import annotations

from typing import Any

from ..outputs import Reject
from ..state import BATCH_WINDOW, BatchNumbers
from ..stream import Stream

__all__ = ["applied", "check", "missing", "standing", "take"]


def _numbers(stream: Stream[Any]) -> BatchNumbers:
    return stream.state.batch_numbers or BatchNumbers()


def applied(stream: Stream[Any], n: int) -> bool:
    """Whether the batch numbered ``n`` was applied to ``stream`` (its resend is answered as
    it was)."""
    nums = _numbers(stream)
    return 0 < n <= nums.through or n in nums.above


def missing(nums: BatchNumbers) -> list[int]:
    """The numbers between the watermark and the highest number applied that no batch took."""
    if not nums.above:
        return []
    taken = set(nums.above)
    return [n for n in range(nums.through + 1, nums.above[-1]) if n not in taken]


def standing(stream: Stream[Any]) -> tuple[int, list[int]]:
    """Where the stream's numbering stands: the number after the highest applied, and the
    numbers below it no batch took (what a seller that lost its numbering goes on with)."""
    nums = _numbers(stream)
    return (nums.above[-1] if nums.above else nums.through) + 1, missing(nums)


def check(stream: Stream[Any], n: int) -> None:
    """Refuse (``batch_seq_out_of_window``) a number more than the window above the watermark
    (taking it would need more room than the record has). The refusal's details say where the
    numbering stands, so the seller can number its batch again."""
    nums = _numbers(stream)
    if n <= nums.through + BATCH_WINDOW:
        return
    after, gaps = standing(stream)
    raise Reject(
        "batch_seq_out_of_window",
        f"stream {stream.id!r} has applied every batch numbered up to {nums.through}"
        + (f" and {len(nums.above)} above it, missing {_few(gaps)}" if gaps else "")
        + f"; {n} is more than {BATCH_WINDOW} above it. Number this batch "
        f"{gaps[0] if gaps else after} and the next ones from there (the refusal's details: "
        "through, missing, next); the client library does it for you",
        through=nums.through,
        missing=gaps,
        next=after,
    )


def _few(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:8]))
    return shown + (f" and {len(numbers) - 8} more" if len(numbers) > 8 else "")


def take(stream: Stream[Any], n: int) -> None:
    """Note that the batch numbered ``n`` (checked by :func:`check`) was applied whole."""
    nums = _numbers(stream)
    if n <= nums.through or n in nums.above:
        return
    above = sorted({*nums.above, n})
    through = nums.through
    while above and above[0] == through + 1:
        through = above.pop(0)
    stream.state.batch_numbers = BatchNumbers(through=through, above=above)
    stream.touch()
