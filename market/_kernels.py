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

import functools
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
    scratch = _Scratch(min(n, BLOCK))
    for start in range(0, n, BLOCK):
        sl = slice(start, min(start + BLOCK, n))
        _bridge_block(out[sl], upper[sl], lower[sl], k, uniforms, scratch)


class _BridgeConstants(NamedTuple):
    d: float
    ab: float
    c: float
    w1: float
    c_a: float
    w_b: float
    both_atoms: bool


class _Scratch:
    """Block-sized work arrays, allocated once per call and reused by every block.

    Each step of the kernel writes into one of these (``out=``) instead of a fresh temporary:
    the same operations in the same order, so the same bits, without ~30 allocations per block.
    """

    __slots__ = ("a", "b", "c2", "cb", "diff", "f2", "f3", "g1", "g2", "gb", "m", "t", "z")

    def __init__(self, n: int) -> None:
        f = functools.partial(np.empty, n, dtype=np.float64)
        self.diff, self.t, self.a, self.b, self.c2, self.cb = f(), f(), f(), f(), f(), f()
        self.g1, self.g2, self.f2, self.f3, self.z = f(), f(), f(), f(), f()
        self.gb, self.m = np.empty(n, dtype=bool), np.empty(n, dtype=bool)

    def view(self, n: int) -> _Scratch:
        if n == self.t.shape[0]:
            return self
        part = object.__new__(_Scratch)
        for name in _Scratch.__slots__:
            setattr(part, name, getattr(self, name)[:n])
        return part


def _bridge_block(
    o: NDArray[np.float64],
    u_blk: NDArray[np.float64],
    l_blk: NDArray[np.float64],
    k: _BridgeConstants,
    uniforms: Uniforms,
    scratch: _Scratch,
) -> None:
    """One block of :func:`laplace_bridge_into` (the same operations for every coordinate).

    When ``upper`` is the exact value (a relaxation, ``mu_a = 0``) the ``W1 = 0`` atom has no
    mass: ``c_a == w1`` exactly, so its indicator equals ``g1`` and the copy of ``upper`` selects
    nothing. Both are skipped then — a branch on the public levels only, with identical results.
    """
    s = scratch.view(int(o.shape[0]))
    np.subtract(l_blk, u_blk, out=s.diff)
    np.abs(s.diff, out=s.t)
    r = uniforms.take(int(s.t.shape[0]))
    _bridge_masses(s, k, r)
    relax = k.c_a == k.w1
    _bridge_pieces(s, k, r, relax)
    _bridge_inverse(s, k, r)
    np.add(s.z, u_blk, out=o)
    m = s.m
    np.greater_equal(r, s.c2, out=m)
    m &= s.gb  # the W1 = k atom: lower's sample, bit for bit
    if k.both_atoms:
        m &= s.t != 0.0
    np.copyto(o, l_blk, where=m)
    if not relax:  # the W1 = 0 atom: upper's sample
        np.greater_equal(r, k.w1, out=m)
        np.less(r, k.c_a, out=s.gb)
        m &= s.gb
        np.copyto(o, u_blk, where=m)


def _bridge_masses(s: _Scratch, k: _BridgeConstants, r: NDArray[np.float64]) -> None:
    """Cumulative masses of the pieces (c2, c_b, w3 in ``s.b``) and ``r`` scaled to the total."""
    d, ab, c = k.d, k.ab, k.c
    em = s.a
    np.multiply(s.t, -d, out=em)
    np.expm1(em, out=em)  # exp(-d t) - 1, in (-1, 0]
    np.multiply(em, -c / d, out=s.c2)
    s.c2 += k.c_a  # end of the middle piece 0 <= x <= t
    em += 1.0  # e = exp(-d t) from here on
    np.multiply(em, k.w_b, out=s.cb)
    s.cb += s.c2  # end of the W1 = k atom
    np.multiply(em, c / ab, out=s.b)  # w3: the right piece x > t
    np.maximum(s.b, _TINY, out=s.b)
    np.maximum(r, _R_FLOOR, out=r)  # keep the log finite
    np.add(s.cb, s.b, out=em)  # the total mass
    r *= em


def _bridge_pieces(s: _Scratch, k: _BridgeConstants, r: NDArray[np.float64], relax: bool) -> None:
    """0/1 indicators of the pieces: g1 (left), g2, gb (below the atom), f2 (middle), f3."""
    m = s.m
    np.less(r, k.w1, out=m)
    s.g1[...] = m
    np.less(r, s.c2, out=m)
    s.g2[...] = m
    np.less(r, s.cb, out=s.gb)
    if relax:
        np.subtract(s.g2, s.g1, out=s.f2)  # indicator of the middle piece
    else:
        np.less(r, k.c_a, out=m)
        np.subtract(s.g2, m, out=s.f2)
    np.subtract(1.0, s.gb, out=s.f3)  # indicator of the right piece


def _bridge_inverse(s: _Scratch, k: _BridgeConstants, r: NDArray[np.float64]) -> None:
    """``s.z`` = W1 by the inverse CDF of the chosen piece, signed like ``lower - upper``.

    Each piece is inverted as x = offset + m * log1p(z): one transcendental per coordinate
    whichever piece is chosen; atoms get z = 0, so log1p(z) = 0.
    """
    d, ab, c = k.d, k.ab, k.c
    z, tmp, w3 = s.z, s.a, s.b
    np.multiply(r, 1.0 / k.w1, out=z)
    z -= 1.0
    z *= s.g1
    np.subtract(r, k.c_a, out=tmp)
    tmp *= -d / c
    tmp *= s.f2
    z += tmp
    np.subtract(s.cb, r, out=tmp)
    tmp /= w3
    tmp *= s.f3
    z += tmp
    np.log1p(z, out=z)
    np.multiply(s.g1, 1.0 / ab, out=tmp)
    np.multiply(s.f2, 1.0 / d, out=w3)  # w3 is not needed any more
    tmp -= w3
    np.multiply(s.f3, 1.0 / ab, out=w3)
    tmp -= w3
    z *= tmp
    np.subtract(1.0, s.g2, out=tmp)
    tmp *= s.t
    z += tmp
    if k.both_atoms:
        z *= s.t != 0.0
    np.copysign(1.0, s.diff, out=tmp)
    z *= tmp


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
