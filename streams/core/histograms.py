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

from market.histogram_chain import (
    GRID,
    HistogramChain,
    HistogramRelease,
    HistogramValue,
    string_key,
)

from ..wire.events import ReleasedValue, StreamRegistration, ValueItem
from .delivery import listed
from .outputs import Reject

__all__ = [
    "as_released",
    "histogram_chain",
    "histogram_value",
    "is_histogram",
    "released",
    "work_width",
]

_DIGITS = re.compile(r"0|[1-9][0-9]{0,18}")


def is_histogram(reg: StreamRegistration) -> bool:
    """Whether the stream sells histograms."""
    return reg.histogram is not None


def histogram_chain(reg: StreamRegistration, levels: tuple[float, ...]) -> HistogramChain | None:
    """The stream's histogram chain (``None`` on other streams); its survival law is computed
    here, once per set of parameters and worker: streams that share them share the chain (it is
    immutable, and a value's noise is keyed by its stream and id, not by the chain object)."""
    spec = reg.histogram
    if spec is None:
        return None
    return _shared_chain(levels, float(reg.sensitivity), spec.domain, float(spec.false_keys))


@functools.lru_cache(maxsize=64)
def _shared_chain(
    levels: tuple[float, ...], sensitivity: float, domain: int, false_keys: float
) -> HistogramChain:
    return HistogramChain(levels, sensitivity=sensitivity, domain=domain, false_keys=false_keys)


def work_width(reg: StreamRegistration) -> int:
    """Work units per value-step beyond the fixed overhead: the numbers a release carries, and
    on a histogram stream the survival grid each step reads."""
    return reg.release_width() + (GRID if is_histogram(reg) else 0)


def histogram_value(
    chain: HistogramChain, reg: StreamRegistration, item: ValueItem
) -> HistogramValue:
    """The exact counts of one published histogram, or a refusal saying what is wrong."""
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
            f"value {vid!r} has {len(item.keys)} keys but {len(item.values)} counts",
        )
    if len(item.keys) > reg.dimension:
        raise Reject(
            "invalid_value",
            f"value {vid!r} has {len(item.keys)} keys; stream {reg.stream_id!r} takes at most "
            f"{reg.dimension} per value (its dimension)",
        )
    keys = _integer_keys(item, spec.domain) if spec.key_space == "integers" else _hashed(item)
    try:
        return chain.value(keys, item.values)
    except ValueError as exc:  # InvalidValueError: a repeated key, a count that is not finite
        raise Reject("invalid_value", f"value {vid!r}: {exc}") from None


def _integer_keys(item: ValueItem, domain: int) -> list[int]:
    assert item.keys is not None
    bad = next((k for k in item.keys if not _DIGITS.fullmatch(k) or int(k) >= domain), None)
    if bad is not None:
        raise Reject(
            "invalid_value",
            f"value {item.value_id!r}: key {bad[:40]!r} is not a whole number below the "
            f"domain size {domain}, written in decimal digits without leading zeros",
        )
    return [int(k) for k in item.keys]


def _hashed(item: ValueItem) -> list[int]:
    assert item.keys is not None
    keys = [string_key(k) for k in item.keys]
    if len(set(keys)) != len(keys):
        raise Reject(
            "invalid_value",
            f"value {item.value_id!r}: two of its keys are the same key (or share a 62-bit hash)",
        )
    return keys


def released(
    chain: HistogramChain,
    value: HistogramValue,
    identity: tuple[str, ...],
    levels: set[float],
    rngs: Any,
) -> tuple[dict[float, HistogramRelease], int]:
    """The value released at each of ``levels`` (one walk up the chain), and the chain steps
    computed."""
    by_step = {chain.step_of(lv): lv for lv in levels}
    out = chain.release_steps(value, set(by_step), identity, rngs)
    return {by_step[k]: r for k, r in out.items()}, max(by_step, default=-1) + 1


def as_released(
    value_id: str, seq: int, level: float, release: HistogramRelease
) -> ReleasedValue:
    """One histogram release on the wire, listed as deliveries list it
    (:func:`~streams.core.delivery.listed`: keys as decimal text, exact in every language)."""
    values, keys = listed(release)
    return ReleasedValue.model_construct(value_id=value_id, seq=seq, level=level, values=values,
                                         keys=keys)  # fmt: skip
