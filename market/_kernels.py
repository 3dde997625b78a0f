"""Vectorised conditional samplers: the hot path of every release.

These functions are the only place where noise is drawn. They work on 1-D float64 arrays in
blocks of :data:`BLOCK` coordinates: numpy's elementwise ops are fast, but a temporary array of
10^6 floats costs more in page faults than the arithmetic on it, so blocks that stay in cache
make the whole kernel about twice as fast.

Side channels: every coordinate goes through the same arithmetic whichever branch of the mixture
it lands in (atom kept, atom moved, one of three exponential pieces). Branches are selected by
multiplying with 0/1 indicators and by ``np.copyto(where=...)``, never by Python ``if`` on data,
so the time taken does not reveal whether an old sample was kept. The only Python branches are on
the (public) privacy levels.

Derivation of the Laplace bridge (see ``docs/math.md`` for the full version). Let the more
accurate neighbour ``U`` (scale ``b_u``, possibly the exact value, ``b_u = 0``) and the less
accurate neighbour ``L`` (scale ``b_l``) bracket a new scale ``b``, ``b_u < b < b_l``. The
convolution preorder (Koufogiannis Thm. 9; Andersson Claim F.3) writes

    Y_b = U + W1,   L = Y_b + W2,
    W1 ~ mu_a δ0 + (1 - mu_a) Lap(b),      mu_a = (b_u / b)^2,
    W2 ~ mu_b δ0 + (1 - mu_b) Lap(b_l),    mu_b = (b / b_l)^2,

with W1, W2 independent. Given ``k = L - U = W1 + W2`` the conditional law of W1 has, for
``k != 0``, unnormalised weights (divide every density by ``exp(-|k|/b_l)``):

    W1 = 0       : mu_a (1 - mu_b) / (2 b_l)                     [only if U is a release]
    W1 = k       : (1 - mu_a) mu_b / (2 b) * exp(-(1/b - 1/b_l)|k|)
    W1 continuous: (1 - mu_a)(1 - mu_b) f_b(x) f_{b_l}(k - x), a three-piece exponential.

Andersson et al.'s Lemma F.5 pairs the atoms and scales the other way round (``mu_1 = b²/b_1²``
attached to the Laplace(b) piece); the version above is the one that matches Claim F.3, and it
reduces to Koufogiannis's Algorithm 1 when U is the exact value (``mu_a = 0``). When ``k == 0``
and both pieces have atoms, the atom-atom event has positive probability and dominates: W1 = 0.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

__all__ = ["BLOCK", "Uniforms", "laplace_bridge_into", "laplace_extend_into"]

BLOCK = 16384


class Uniforms:
    """Uniform [0, 1) draws consumed block by block by a kernel.

    Either straight from one generator, or from several generators concatenated (one per value of
    a batch): drawing ``rng.random(n)`` in blocks gives the same numbers as in one call, so a
    value's release is bit-identical whether it is sampled alone or inside a batch.
    """

    __slots__ = ("_buf", "_pos", "_rng")

    def __init__(
        self, rng: np.random.Generator | None = None, buf: NDArray[np.float64] | None = None
    ):
        self._rng, self._buf, self._pos = rng, buf, 0

    @classmethod
    def concatenated(cls, parts: list[tuple[np.random.Generator, int]]) -> Uniforms:
        return cls(buf=np.concatenate([rng.random(n) for rng, n in parts]))

    def take(self, n: int) -> NDArray[np.float64]:
        if self._buf is None:
            assert self._rng is not None
            return self._rng.random(n)
        out = self._buf[self._pos : self._pos + n].copy()
        self._pos += n
        return out


_TINY = float(np.finfo(np.float64).tiny)
_R_FLOOR = 2.0**-64  # numpy uniforms are multiples of 2**-53, so this only replaces an exact 0


def laplace_bridge_into(
    out: NDArray[np.float64],
    upper: NDArray[np.float64],
    lower: NDArray[np.float64],
    alpha: float,
    beta: float,
    mu_a: float,
    mu_b: float,
    uniforms: Uniforms,
) -> None:
    """Write ``U + W1`` (conditioned on ``W1 + W2 = lower - upper``) into ``out``.

    ``alpha = 1/b`` and ``beta = 1/b_l`` are inverse scales with ``alpha > beta > 0``; ``mu_a``
    and ``mu_b`` are the atom probabilities of the two pieces (``mu_a = 0`` when ``upper`` is the
    exact value). Coordinates that take the ``W1 = k`` atom get ``lower``'s value bit for bit, and
    those that take ``W1 = 0`` get ``upper``'s, so releases that share a sample are identical.
    """
    d = alpha - beta
    c = (1.0 - mu_a) * (1.0 - mu_b) * alpha * beta / 4.0
    w1 = c / (alpha + beta)  # left exponential piece (x < 0), constant after rescaling
    k = _BridgeConstants(
        d=d,
        ab=alpha + beta,
        c=c,
        w1=w1,
        c_a=w1 + mu_a * (1.0 - mu_b) * beta / 2.0,  # end of the W1 = 0 atom
        w_b=(1.0 - mu_a) * mu_b * alpha / 2.0,
        both_atoms=mu_a > 0.0 and mu_b > 0.0,
    )
    n = out.shape[0]
    for start in range(0, n, BLOCK):
        sl = slice(start, min(start + BLOCK, n))
        _bridge_block(out[sl], upper[sl], lower[sl], k, uniforms)


class _BridgeConstants(NamedTuple):
    d: float
    ab: float
    c: float
    w1: float
    c_a: float
    w_b: float
    both_atoms: bool


def _bridge_block(
    o: NDArray[np.float64],
    u_blk: NDArray[np.float64],
    l_blk: NDArray[np.float64],
    k: _BridgeConstants,
    uniforms: Uniforms,
) -> None:
    """One block of :func:`laplace_bridge_into` (the same operations for every coordinate)."""
    d, ab, c, w1, c_a = k.d, k.ab, k.c, k.w1, k.c_a
    diff = l_blk - u_blk
    t = np.abs(diff)
    em = t * (-d)
    np.expm1(em, out=em)  # exp(-d t) - 1, in (-1, 0]
    e = em + 1.0
    c2 = em * (-c / d)
    c2 += c_a  # end of the middle piece 0 <= x <= t
    c_b = e * k.w_b
    c_b += c2  # end of the W1 = k atom
    w3 = e * (c / ab)  # right piece x > t
    np.maximum(w3, _TINY, out=w3)
    r = uniforms.take(int(t.shape[0]))
    np.maximum(r, _R_FLOOR, out=r)  # keep the log finite
    r *= c_b + w3
    g1 = (r < w1).astype(np.float64)
    g_a = (r < c_a).astype(np.float64)
    g2 = (r < c2).astype(np.float64)
    g_b = r < c_b
    f2 = g2 - g_a  # indicator of the middle piece
    f3 = 1.0 - g_b  # indicator of the right piece
    # Inverse CDF of each piece, as x = offset + m * log1p(z): one transcendental per
    # coordinate whichever piece is chosen; atoms get z = 0, so log1p(z) = 0.
    z = (r * (1.0 / w1) - 1.0) * g1
    z += ((r - c_a) * (-d / c)) * f2
    z += ((c_b - r) / w3) * f3
    np.log1p(z, out=z)
    z *= g1 * (1.0 / ab) - f2 * (1.0 / d) - f3 * (1.0 / ab)
    z += t * (1.0 - g2)
    if k.both_atoms:
        z *= t != 0.0
    z *= np.copysign(1.0, diff)
    z += u_blk
    o[...] = z
    take_lower = g_b & (r >= c2)
    if k.both_atoms:
        take_lower &= t != 0.0
    np.copyto(o, l_blk, where=take_lower)
    np.copyto(o, u_blk, where=(r >= w1) & (r < c_a))


def laplace_extend_into(
    out: NDArray[np.float64],
    upper: NDArray[np.float64],
    scale: float,
    mu: float,
    uniforms: Uniforms,
) -> None:
    """Write ``U + W`` with ``W ~ mu δ0 + (1 - mu) Lap(scale)`` into ``out``.

    This is a fresh Laplace release (``mu = 0``, ``U`` the exact value) or the tightening step of
    Koufogiannis eq. (25) (``mu = (b_u / b)^2``). A single uniform drives an inverse CDF ordered
    by x (negative half, atom, positive half), so the work is the same for every coordinate.
    """
    h = (1.0 - mu) / 2.0
    n = out.shape[0]
    for start in range(0, n, BLOCK):
        sl = slice(start, min(start + BLOCK, n))
        u_blk = upper[sl]
        r = uniforms.take(int(u_blk.shape[0]))
        np.maximum(r, _R_FLOOR, out=r)  # keep the log finite
        neg_mask = r < h
        pos = r >= h + mu
        neg = neg_mask.astype(np.float64)
        posf = pos.astype(np.float64)
        z = (r * (1.0 / h) - 1.0) * neg
        z += ((h + mu - r) * (1.0 / h)) * posf
        np.log1p(z, out=z)
        z *= (neg - posf) * scale
        z += u_blk
        o = out[sl]
        o[...] = z
        np.copyto(o, u_blk, where=~(neg_mask | pos))
