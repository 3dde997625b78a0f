"""The few :mod:`scipy.special` functions the market uses, with scipy imported on first use.

Importing scipy costs ~0.2 s, which every worker and every command-line process paid at start
although most of them never quote a Poisson interval or release a histogram.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ndtr", "ndtri", "pdtr", "pdtrc"]


def ndtr(x: Any) -> Any:
    """Φ(x), the standard normal CDF (elementwise)."""
    from scipy import special  # noqa: PLC0415 - deferred: see the module docstring

    return special.ndtr(x)


def ndtri(p: Any) -> Any:
    """Φ⁻¹(p), the standard normal quantile (elementwise)."""
    from scipy import special  # noqa: PLC0415 - deferred: see the module docstring

    return special.ndtri(p)


def pdtr(k: Any, lam: Any) -> Any:
    """P(N ≤ k) for N ~ Poisson(lam)."""
    from scipy import special  # noqa: PLC0415 - deferred: see the module docstring

    return special.pdtr(k, lam)


def pdtrc(k: Any, lam: Any) -> Any:
    """P(N > k) for N ~ Poisson(lam)."""
    from scipy import special  # noqa: PLC0415 - deferred: see the module docstring

    return special.pdtrc(k, lam)
