"""RAPPOR reports: each value a member's bits, released as randomized responses a buyer relaxes.

A value is a population member's report input, ``dimension`` bits (0 or 1, at most
``rappor_ones`` of them set: a Bloom filter's, or a category as one bit). The market keeps its
Laplace noise exactly as for ``values`` (:mod:`.vectors`: the stored chain, the noise a pure
function of the request, docs/protocol.md §1.3) and releases at a level the bits
``[y + V > 1/2]`` of that level's lattice Laplace release ``y + V``
(:func:`market.rappor.released_bits`, docs/protocol.md §1.10): RAPPOR's permanent randomized
response written as thresholded Laplace noise (Koufogiannis et al. §4.2). A purchase step to
a higher level is the chain's Laplace relaxation of the stored noise, so its bits are the
relaxed RAPPOR's with a smaller f, and a coalition's bits at several levels are functions of
Laplace releases that carry no more than the highest (docs/math.md). Each level's law is
stated beside its ε (:class:`~streams.wire.products.rappor.RandomizedResponse`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from market import ChainState
from market.histogram_chain import HistogramValue
from market.rappor import released_bits

from ...wire.events import ReleasedValue, ValueItem
from ...wire.products.rappor import RapporFields
from ..context import Context
from ..delivery import Release
from ..outputs import Reject
from ..stream import Stream
from .base import Exact, Identity, numbers
from .vectors import Vectors

__all__ = ["Rappor"]


class Rappor(Vectors):
    """Bit reports on one lossless Laplace chain per value, released as thresholded bits."""

    fields = RapporFields
    name = RapporFields.name

    def exact(self, item: ValueItem) -> Exact:
        exact = numbers(self.terms, self.reg, item)
        _check_report(exact.value, item.value_id, self.reg.rappor_ones)
        return exact

    def releases(
        self,
        ctx: Context,
        state: ChainState | HistogramValue,
        identity: Identity,
        levels: set[float],
        released_before: float,
    ) -> tuple[dict[float, Release], int]:
        laplace, new_noise = super().releases(ctx, state, identity, levels, released_before)
        bits: dict[float, Release] = {}
        for lv, r in laplace.items():
            assert not isinstance(r, tuple)  # a vector, not a keyed release
            bits[lv] = released_bits(r)
        return bits, new_noise

    def release_window(
        self, ctx: Context, stream: Stream[Any], level: float
    ) -> tuple[list[ReleasedValue], int]:
        laplace, new_noise = super().release_window(ctx, stream, level)
        bits = [
            r.model_copy(update={"values": released_bits(np.asarray(r.values)).tolist()})
            for r in laplace
        ]
        return bits, new_noise


def _check_report(value: Any, value_id: str, ones: int | None) -> None:
    """Refuse (``invalid_value``) a report (its length checked: ``dimension``) whose numbers
    are not bits or set more than ``ones`` of them: the stream's sensitivity, and so every
    level's ε, assumes it."""
    assert not isinstance(value, HistogramValue) and ones is not None
    x = np.asarray(value)
    if not np.all((x == 0.0) | (x == 1.0)):
        raise Reject(
            "invalid_value",
            f"value {value_id!r}: a RAPPOR report's numbers are bits, each 0 or 1; not all of "
            "these are (a category is one bit set, a Bloom filter its hashes' bits)",
        )
    if int(x.sum()) > ones:
        raise Reject(
            "invalid_value",
            f"value {value_id!r} sets {int(x.sum())} bits; the stream's rappor_ones is {ones}: a "
            "report sets at most that many (the sensitivity, and every level's ε, assume it)",
        )
