"""Histogram streams: a seller's sparse count maps, released as the keys above a threshold.

A value of a ``histogram`` stream is a map from keys to counts over a domain of up to 2⁶² keys
(``integers`` below ``domain_size``, or ``strings`` mapped to their public 62-bit hash by
:func:`market.histogram_chain.string_key`). What a buyer holding level ρ gets of it is every key
whose noisy count exceeds the level's threshold, with that noisy count
(:class:`market.histogram_chain.HistogramChain`): keys with a zero count show up only as often as
the seller's ``false_keys`` tolerance says, and a key in the data with a small count may be
missing, whatever the domain's size.

The stored state of a value is only its exact counts (a
:class:`~market.histogram_chain.HistogramValue`); a release is recomputed from them, a pure
function of the market's noise secret, the stream's chain, the value's identity (stream, value
id, a digest of its keys and counts) and the step. The rest — the window, dedup, eviction,
privacy windows, deliveries, purchases and receipts — is the path every stream takes.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from market import ChainState
from market.histogram_chain import (
    GRID,
    HistogramChain,
    HistogramRelease,
    HistogramValue,
    string_key,
)
from market.receipts import KEYED_RECEIPT_VERSION, ReleaseTriple

from ...wire.events import ReleasedValue, StreamRegistration, ValueItem
from ...wire.products.histogram import HistogramFields
from ...wire.trusted import trusted
from ..context import Context
from ..delivery import Listed, Release
from ..outputs import Reject
from ..stream import Stream
from ..terms import Terms
from .base import Exact, Identity, check_counts, value_identity
from .retained import Retained

__all__ = ["Histograms", "as_released", "shared_chain"]

_DIGITS = re.compile(r"0|[1-9][0-9]{0,18}")


@functools.lru_cache(maxsize=64)
def shared_chain(
    levels: tuple[float, ...], sensitivity: float, domain: int, false_keys: float
) -> HistogramChain:
    """The histogram chain of a set of parameters: its survival law is computed once per
    worker, and streams that share the parameters share the chain (it is immutable, and a
    value's noise is keyed by its stream and id, not by the chain object)."""
    return HistogramChain(levels, sensitivity=sensitivity, domain=domain, false_keys=false_keys)


class Histograms(Retained):
    """Values that are sparse count maps, released as the keys above a threshold."""

    fields = HistogramFields
    name = HistogramFields.name
    receipt_version = KEYED_RECEIPT_VERSION

    def __init__(self, reg: StreamRegistration, terms: Terms) -> None:
        super().__init__(reg, terms)
        spec = reg.histogram
        assert spec is not None
        self.chain = shared_chain(
            terms.levels, float(reg.sensitivity), spec.domain, float(spec.false_keys)
        )

    @classmethod
    def work_width(cls, reg: StreamRegistration) -> int:
        """The numbers a release carries and the survival grid each step reads."""
        return reg.release_width() + GRID

    @staticmethod
    def committed(release: ReleasedValue) -> ReleaseTriple:
        """Its value id, level and noisy counts, and the keys they are of."""
        return (release.value_id, release.level, release.values, release.keys)

    @staticmethod
    def listed(release: Release) -> Listed:
        """Its noisy counts, and their keys as decimal text (exact in every language)."""
        assert isinstance(release, tuple)  # (keys, noisy counts)
        keys, counts = release
        return counts.tolist(), [str(k) for k in keys.tolist()]

    def exact(self, item: ValueItem) -> Exact:
        value = self._counts(item)
        return Exact(value, value.digest())

    def new_state(
        self, ctx: Context, stream: Stream[Any], identity: Identity, exact: Exact
    ) -> tuple[HistogramValue, int]:
        assert isinstance(exact.value, HistogramValue)
        return exact.value, 0

    def releases(
        self,
        ctx: Context,
        state: ChainState | HistogramValue,
        identity: Identity,
        levels: set[float],
        released_before: float,
    ) -> tuple[dict[float, Release], int]:
        """Recomputed from the counts every time: what counts as new is a level above
        ``released_before``, so a resend adds none."""
        assert isinstance(state, HistogramValue)
        by_step = {self.chain.step_of(lv): lv for lv in levels}
        out = self.chain.release_steps(state, set(by_step), identity, ctx.rngs)
        by_level: dict[float, Release] = {by_step[k]: r for k, r in out.items()}
        return by_level, sum(lv > released_before for lv in by_level)

    def release_window(
        self, ctx: Context, stream: Stream[Any], level: float
    ) -> tuple[list[ReleasedValue], int]:
        step = self.chain.step_of(level)
        releases = []
        window = stream.state.window
        for e, value in zip(window, self.retained_states(ctx, stream), strict=True):
            assert isinstance(value, HistogramValue)
            ident = value_identity(stream.id, e.value_id, e.digest)
            releases.append(
                as_released(
                    e.value_id, e.seq, level, self.chain.release(value, step, ident, ctx.rngs)
                )
            )
        return releases, sum(e.level < level for e in window)  # levels not released before

    def _counts(self, item: ValueItem) -> HistogramValue:
        """The exact counts of one published histogram, or a refusal saying what is wrong."""
        reg = self.reg
        spec = reg.histogram
        assert spec is not None
        vid = item.value_id
        if item.keys is None:
            raise Reject(
                "invalid_value",
                f"value {vid!r}: stream {reg.stream_id!r} sells histograms; send each value as "
                "`keys` with their counts in `values`",
            )
        if len(item.keys) != len(item.values):
            raise Reject(
                "invalid_value",
                f"value {vid!r} needs one count in `values` per key in `keys`",
            )
        if len(item.keys) > reg.dimension:
            raise Reject(
                "invalid_value",
                f"value {vid!r} has more keys than stream {reg.stream_id!r} takes per value "
                f"({reg.dimension}, its dimension)",
            )
        check_counts(reg, item)
        keys = _integer_keys(item, spec.domain) if spec.key_space == "integers" else _hashed(item)
        try:
            return self.chain.value(keys, item.values)
        except ValueError as exc:  # InvalidValueError: a repeated key, a count that is not finite
            raise Reject("invalid_value", f"value {vid!r}: {exc}") from None


def _integer_keys(item: ValueItem, domain: int) -> list[int]:
    assert item.keys is not None
    bad = next(
        (i for i, k in enumerate(item.keys) if not _DIGITS.fullmatch(k) or int(k) >= domain), None
    )
    if bad is not None:
        raise Reject(
            "invalid_value",
            f"value {item.value_id!r}: key {bad} (counting from 0) is not a whole number below the "
            f"domain size {domain}, written in decimal digits without leading zeros",
        )
    return [int(k) for k in item.keys]


def _hashed(item: ValueItem) -> list[int]:
    assert item.keys is not None
    try:
        keys = [string_key(k) for k in item.keys]
    except UnicodeEncodeError:  # a lone surrogate, from sealed numbers' JSON escapes
        raise Reject(
            "invalid_value",
            f"value {item.value_id!r}: a key is not Unicode text (a lone surrogate)",
        ) from None
    if len(set(keys)) != len(keys):
        raise Reject(
            "invalid_value",
            f"value {item.value_id!r}: two of its keys are the same key (one text in two Unicode "
            "forms, NFC and NFD, is one key) or share a 62-bit hash",
        )
    return keys


def as_released(value_id: str, seq: int, level: float, release: HistogramRelease) -> ReleasedValue:
    """One histogram release on the wire, listed as deliveries list it
    (:meth:`Histograms.listed`: keys as decimal text, exact in every language)."""
    values, keys = Histograms.listed(release)
    return trusted(ReleasedValue, value_id=value_id, seq=seq, level=level, values=values, keys=keys)
