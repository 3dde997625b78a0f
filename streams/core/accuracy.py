"""The error model every release carries, and the offers a quote lists (see market.accuracy).

Both are functions of public facts — the stream's mechanism and sensitivity and the level — so
a buyer can recompute them; the market states them so that no buyer has to.
"""

from __future__ import annotations

from functools import lru_cache

from market.accuracy import error_model
from market.mechanisms import mechanism

from ..wire.events import UNIT_OF, ErrorModelInfo, MechanismName, StreamRegistration
from ..wire.products import section_of
from ..wire.products.rappor import RandomizedResponse

__all__ = ["error_info", "offer_accuracy", "randomized_response", "threshold"]


def error_info(reg: StreamRegistration, level: float) -> ErrorModelInfo | None:
    """What a release of ``reg``'s stream at ``level`` says about its noise (``None`` for no
    level)."""
    if level <= 0:
        return None
    info = _info(reg.mechanism, reg.release_sensitivity(), reg.dimension, float(level))
    said = {
        "threshold": threshold(reg, level),
        "randomized_response": randomized_response(reg, level),
    }
    update = {k: v for k, v in said.items() if v is not None}
    return info.model_copy(update=update) if update else info


def threshold(reg: StreamRegistration, level: float) -> float | None:
    """The threshold a release at ``level`` states: on a histogram stream a public function of
    the registration (its product's wire section, :mod:`streams.wire.products`); ``None``
    elsewhere."""
    return section_of(reg).threshold(reg, level)


def randomized_response(reg: StreamRegistration, level: float) -> RandomizedResponse | None:
    """The law of each bit a release at ``level`` shows: on a stream of bit reports a public
    function of the registration (its product's wire section); ``None`` elsewhere."""
    return section_of(reg).randomized_response(reg, level)


@lru_cache(maxsize=4096)
def _info(name: MechanismName, sensitivity: float, dimension: int, level: float) -> ErrorModelInfo:
    m = error_model(mechanism(name, sensitivity, dimension), level)
    return ErrorModelInfo.model_construct(
        mechanism=name,
        level=m.level,
        unit=UNIT_OF[name],
        scale=m.scale,
        std=m.std,
        offset=m.offset,
        half_widths=m.standard_half_widths(),
        grid=m.grid,
    )


@lru_cache(maxsize=4096)
def offer_accuracy(
    name: MechanismName, sensitivity: float, dimension: int, level: float
) -> tuple[float, float]:
    """RMS error and 95 % half-width of a level, for a quote's offers (one half-width, not
    three: a quote lists every level of the stream)."""
    m = error_model(mechanism(name, sensitivity, dimension), level)
    return m.std, m.half_width(0.95)
