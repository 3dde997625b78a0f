"""The wire section of ``histogram``: its ``histogram`` spec (:class:`HistogramSpec`: key space,
domain, false keys), the checks of a histogram registration, and the public threshold of each
level (:mod:`market.histogram_chain`)."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from market.histogram_chain import threshold as histogram_threshold
from market.levels import canonical_level
from market.pricing import sellable_levels

from ..safe_integers import MAX_SAFE_INTEGER, safe_integer
from .base import Canon, ProductFields

if TYPE_CHECKING:
    from ..events import StreamRegistration

__all__ = ["MAX_HISTOGRAM_LEVELS", "HistogramFields", "HistogramSpec", "KeySpace"]

MAX_HISTOGRAM_LEVELS = 16
KeySpace = Literal["integers", "strings"]
"""The keys of a histogram stream: whole numbers below ``domain_size``, or strings (released as
their public 62-bit hash, :func:`market.histogram_chain.string_key`)."""
_DomainSize = Annotated[
    int, Field(ge=1, json_schema_extra={"maximum": MAX_SAFE_INTEGER}), AfterValidator(safe_integer)
]


class HistogramSpec(BaseModel):
    """What a ``histogram`` stream's values are: sparse maps from keys to counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key_space: KeySpace = Field(
        description="'integers': keys 0 … domain_size − 1; 'strings': any text, released as "
        "its public 62-bit hash (the domain is 2**62)"
    )
    domain_size: _DomainSize | None = Field(
        None,
        description="integers only: how many keys there are (up to 2**53 - 1; larger "
        "key spaces are 'strings')",
    )
    false_keys: Annotated[float, Field(ge=1e-6, le=1000, allow_inf_nan=False)] = Field(
        1.0,
        description="the expected number of keys with a zero count that all of one value's "
        "releases together show (the thresholds are set from it; a smaller number raises them)",
    )

    @model_validator(mode="after")
    def _domain(self) -> HistogramSpec:
        if (self.key_space == "integers") != (self.domain_size is not None):
            raise ValueError("an 'integers' key space needs a domain_size, and only it has one")
        return self

    @property
    def domain(self) -> int:
        """How many keys there are (2**62 for strings)."""
        return 2**62 if self.domain_size is None else self.domain_size


class HistogramFields(ProductFields):
    """``histogram``: sparse count maps over a domain of up to 2⁶² keys, released as the keys
    whose noisy count exceeds a threshold."""

    name = "histogram"
    field = "histogram"
    field_noun = "a histogram spec"
    noun = "histograms"
    takes_counts = True
    counted_apart = True

    @classmethod
    def check(cls, reg: StreamRegistration) -> None:
        if reg.mechanism != "gaussian":
            raise ValueError(
                "histograms are released with thresholded Gaussian noise: register them with "
                "mechanism 'gaussian' (levels in ρ)"
            )
        if reg.sealed:
            raise ValueError(
                "a histogram stream cannot be sealed: its releases are refined from the exact "
                "counts, never tightened from the top one"
            )
        _check_levels(reg)
        domain = _spec(reg).domain
        if domain < reg.dimension:
            raise ValueError(
                f"dimension {reg.dimension} (the most keys of one value) exceeds the domain's "
                f"{domain} keys"
            )

    @classmethod
    def release_width(cls, reg: StreamRegistration) -> int:
        """Its keys and counts and as many for the keys with a zero count it may show
        (:meth:`false_key_bound`), twice (a sealed histogram release is padded to a power of
        two, see :func:`streams.wire.sealing.padded_length`)."""
        return 4 * (reg.dimension + cls.false_key_bound(reg))

    @classmethod
    def false_key_bound(cls, reg: StreamRegistration) -> int:
        """``ceil(2·false_keys) + 64`` (more happens with probability below 1e-30 and is
        refused)."""
        return math.ceil(2 * _spec(reg).false_keys) + 64

    @classmethod
    def threshold(cls, reg: StreamRegistration, level: float) -> float | None:
        """``z·Δ/√(2ρ)`` (:func:`market.histogram_chain.threshold`): a public function of the
        registration."""
        spec = _spec(reg)
        steps = len(sellable_levels(reg.steps, reg.cap))
        return histogram_threshold(
            canonical_level(level, name="rho"), reg.sensitivity, spec.domain, spec.false_keys, steps
        )

    @classmethod
    def sign(cls, c: Canon, reg: StreamRegistration) -> None:
        h = _spec(reg)
        c.s(reg.product).s(h.key_space)
        c.n() if h.domain_size is None else c.i(h.domain_size)
        c.f(h.false_keys)


def _check_levels(reg: StreamRegistration) -> None:
    """At most :data:`MAX_HISTOGRAM_LEVELS` levels sold, each at least 1 % above the last."""
    levels = len(reg.steps) + (reg.cap > reg.steps[-1])
    if levels > MAX_HISTOGRAM_LEVELS:
        raise ValueError(
            f"a histogram stream sells at most {MAX_HISTOGRAM_LEVELS} levels (its steps and "
            f"the cap), got {levels}: each is a step of the survival law every worker builds"
        )
    sold = [*reg.steps, *([reg.cap] if reg.cap > reg.steps[-1] else [])]
    if any(b < 1.01 * a for a, b in itertools.pairwise(sold)):
        raise ValueError(
            "consecutive levels of a histogram stream (its steps and the cap) must be at "
            "least 1 % apart: closer ones are finer than the survival law that decides when "
            "a key with a zero count first shows"
        )


def _spec(reg: StreamRegistration) -> HistogramSpec:
    assert reg.histogram is not None  # a histogram registration has one
    return reg.histogram
