"""An independent reference implementation of noise format v2 (``docs/protocol.md`` §1).

Written from the text of ``docs/protocol.md`` §1 and general mathematics alone: nothing here is
read, imported or copied from ``market``, ``streams`` or ``bench``. Every outcome is decided in
exact arithmetic:

* integers and :class:`fractions.Fraction` for everything rational (levels, parameters,
  sensitivities, the uniforms' known bits);
* rigorous enclosures ``[lo, hi]`` (two Fractions, ``lo <= true value <= hi``) for every
  transcendental quantity (``exp``, ``log``, ``sqrt``, ``cos``, ``π``), computed from truncated
  series with an explicit bound on the truncation error, the endpoints then rounded *outward* to
  a dyadic rational of a chosen number of significant bits;
* each ideal uniform ``U`` is the half-open interval ``[m/2^(64t), (m+1)/2^(64t))`` of its first
  ``t`` words (main word, then its extension words).

An outcome is returned only when it is the same for every point of the enclosures; otherwise
the working precision is raised and every uniform involved is extended by one more word of its
extension stream, and the decision is retried. No floating-point operation decides anything;
floats appear only as inputs (``rat(x)`` is ``Fraction(x)``, exact) and as outputs (the double
nearest ``n·2^k``, which Python's correctly rounded ``int / int`` gives).

The series and their remainder bounds (all standard):

* ``exp(y)``, ``|y| <= 1/2``: ``Σ_{i<N} y^i/i!`` with ``|R_N| <= |y|^N/N! · 1/(1-|y|)``; larger
  arguments are scaled by ``2^-s`` and the enclosure squared ``s`` times (endpoints positive,
  so squaring is monotone).
* ``log(y)``: ``y = 2^e·f``, ``f ∈ [3/4, 3/2)``, ``log f = 2·atanh(z)``, ``z = (f-1)/(f+1)``,
  ``|z| <= 1/5``; ``atanh(z) = Σ z^(2k+1)/(2k+1)`` with tail ``<= |z|^(2N+1)/((2N+1)(1-z²))``;
  ``log 2 = 2·atanh(1/3)`` the same way.
* ``π = 16·atan(1/5) - 4·atan(1/239)`` (Machin), ``atan(z) = Σ (-1)^k z^(2k+1)/(2k+1)`` with
  tail ``<= |z|^(2N+1)/(2N+1)``.
* ``cos θ``, ``sin θ`` for ``0 <= θ <= 2``: Taylor with the Lagrange remainder
  ``|θ|^n/n!``; and ``|cos(2πu) - cos(2πu')| <= 2π|u - u'| <= 8|u - u'|`` to pass from a
  point to an interval of ``u``.
* ``sqrt``: integer square roots (``math.isqrt``) of the scaled endpoints, rounded outward.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any, TypeVar

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

F = Fraction
Interval = tuple[Fraction, Fraction]
Part = str | bytes | int | float

DOMAIN = b"emarket-noise-v2"
CHAIN_DOMAIN = b"emarket-chain-v2"
CHECK_SECRET = b"emarket noise check: a public test key, never used for real noise"
FAMILY_CODES = {"laplace": 1, "gaussian": 2, "poisson": 3, "discrete_laplace": 4}
# A decision that is still open after this many refinements (each one more 64-bit word of
# every uniform involved) has probability below 2^-1000: treat it as a bug.
MAX_LEVELS = 24
T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# §1.1 identities and request keys


def enc(parts: Iterable[Part]) -> bytes:
    """``enc(parts)``: each part as ``tag ‖ u32be(len(data)) ‖ data``.

    A ``str`` is a text part, ``bytes`` a bytes part, an ``int`` an integer part and a
    ``float`` a double part.
    """
    out = bytearray()
    for part in parts:
        if isinstance(part, str):
            tag, data = b"s", part.encode("utf-8")
        elif isinstance(part, bytes):
            tag, data = b"b", part
        elif isinstance(part, bool):
            raise TypeError("a bool is not an identity part")
        elif isinstance(part, int):
            tag, data = b"i", str(part).encode("ascii")
        elif isinstance(part, float):
            tag, data = b"f", struct.pack(">d", part)
        else:
            raise TypeError(f"not an identity part: {part!r}")
        out += tag + struct.pack(">I", len(data)) + data
    return bytes(out)


def request_key(secret: bytes, parts: Iterable[Part]) -> bytes:
    """``K = SHAKE256("emarket-noise-v2" ‖ 0x00 ‖ u32be(len(S)) ‖ S ‖ enc(I))``, 32 bytes."""
    if len(secret) < 16:
        raise ValueError("the secret must have at least 16 bytes")
    message = DOMAIN + b"\x00" + struct.pack(">I", len(secret)) + secret + enc(parts)
    return hashlib.shake_256(message).digest(32)


# --------------------------------------------------------------------------------------------
# §1.2 draws


def chacha_words(key: bytes, nonce: bytes, count: int) -> list[int]:
    """The first ``count`` little-endian u64 words of the ChaCha20 keystream (counter from 0)."""
    if len(nonce) != 12:
        raise ValueError("a 96-bit nonce")
    # cryptography's 16-byte nonce is u32le(block counter) ‖ the RFC 8439 96-bit nonce
    encryptor = Cipher(algorithms.ChaCha20(key, b"\x00" * 4 + nonce), mode=None).encryptor()
    stream = encryptor.update(b"\x00" * (8 * count))
    return [int.from_bytes(stream[8 * t : 8 * t + 8], "little") for t in range(count)]


def extension_nonce(slot: int, index: int) -> bytes:
    """``0x01 ‖ u8(s) ‖ 0x00 0x00 ‖ u64le(i)``."""
    return bytes([1, slot, 0, 0]) + struct.pack("<Q", index)


class _Stream:
    """A lazily extended keystream of u64 words."""

    def __init__(self, key: bytes, nonce: bytes) -> None:
        self.key, self.nonce, self.words = key, nonce, list[int]()

    def word(self, t: int) -> int:
        if t >= len(self.words):
            self.words = chacha_words(self.key, self.nonce, max(2 * t + 8, 8))
        return self.words[t]


class Uniform:
    """An ideal uniform ``U`` in [0, 1): its main word, then its extension stream's words."""

    def __init__(self, first: int, extension: _Stream) -> None:
        self.bits = first  # the integer m of the words read so far
        self.count = 1  # t, the number of 64-bit words read so far
        self.extension = extension

    def extend(self) -> None:
        """Read one more word (the next of the extension stream)."""
        self.bits = (self.bits << 64) | self.extension.word(self.count - 1)
        self.count += 1

    def ensure(self, count: int) -> None:
        while self.count < count:
            self.extend()

    @property
    def interval(self) -> Interval:
        """``[lo, hi]`` with ``lo <= U < hi`` (the upper end is never attained)."""
        scale = 1 << (64 * self.count)
        return F(self.bits, scale), F(self.bits + 1, scale)


class Draws:
    """The words a sampler of ``n`` coordinates reads from the request key ``key``."""

    def __init__(self, key: bytes, n: int) -> None:
        self.key, self.n = key, n
        self.main = _Stream(key, b"\x00" * 12)
        self._uniforms: dict[tuple[int, int], Uniform] = {}

    def main_word(self, t: int) -> int:
        return self.main.word(t)

    def uniform(self, slot: int, index: int) -> Uniform:
        """Slot ``s`` of coordinate ``i``: begins with ``w_{s·n+i}``; one object per (s, i)."""
        if not 0 <= index < self.n or not 0 <= slot < 256:
            raise IndexError((slot, index))
        found = self._uniforms.get((slot, index))
        if found is None:
            ext = _Stream(self.key, extension_nonce(slot, index))
            found = Uniform(self.main_word(slot * self.n + index), ext)
            self._uniforms[(slot, index)] = found
        return found


def extension_words(key: bytes, slot: int, index: int, count: int) -> list[int]:
    return chacha_words(key, extension_nonce(slot, index), count)


# --------------------------------------------------------------------------------------------
# Exact real arithmetic: outward-rounded dyadic enclosures


def _log2_estimate(x: Fraction) -> int:
    """``⌊log₂ |x|⌋`` or one less (``x != 0``)."""
    return abs(x.numerator).bit_length() - x.denominator.bit_length()


def floor_log2(x: Fraction) -> int:
    """``⌊log₂ x⌋`` exactly, ``x > 0``."""
    e = _log2_estimate(x)
    while F(2) ** e > x:
        e -= 1
    while F(2) ** (e + 1) <= x:
        e += 1
    return e


def down(x: Fraction, p: int) -> Fraction:
    """The largest dyadic with about ``p`` significant bits that is ``<= x``."""
    if x == 0:
        return x
    e = p - _log2_estimate(x)
    num, den = x.numerator, x.denominator
    if e >= 0:
        return F((num << e) // den, 1 << e)
    return F((num // (den << -e)) << -e)


def up(x: Fraction, p: int) -> Fraction:
    """The smallest dyadic with about ``p`` significant bits that is ``>= x``."""
    return -down(-x, p)


def iv(lo: Fraction, hi: Fraction, p: int) -> Interval:
    return down(lo, p), up(hi, p)


def iv_add(a: Interval, b: Interval, p: int) -> Interval:
    return iv(a[0] + b[0], a[1] + b[1], p)


def iv_neg(a: Interval) -> Interval:
    return -a[1], -a[0]


def iv_sub(a: Interval, b: Interval, p: int) -> Interval:
    return iv(a[0] - b[1], a[1] - b[0], p)


def iv_mul(a: Interval, b: Interval, p: int) -> Interval:
    products = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return iv(min(products), max(products), p)


def iv_div(a: Interval, b: Interval, p: int) -> Interval:
    if b[0] <= 0 <= b[1]:
        raise ZeroDivisionError("divisor enclosure contains 0")
    quotients = [a[0] / b[0], a[0] / b[1], a[1] / b[0], a[1] / b[1]]
    return iv(min(quotients), max(quotients), p)


def _exp_series(y: Fraction, bits: int) -> Interval:
    """``exp(y)`` for ``|y| <= 1/2`` to absolute error ``2^-bits`` (unrounded)."""
    total, term, i = F(0), F(1), 0
    bound = F(1, 1 << bits)
    while True:
        total += term
        i += 1
        term = term * y / i
        # the tail Σ_{j >= i} y^j/j! is at most |y^i/i!|·1/(1 - |y|) <= 2|y^i/i!|
        if 2 * abs(term) <= bound:
            tail = 2 * abs(term)
            return total - tail, total + tail


@lru_cache(maxsize=1 << 16)
def exp_iv(x: Fraction, p: int) -> Interval:
    """An enclosure of ``e^x`` (``x`` rational) with about ``p`` correct bits."""
    if x == 0:
        return F(1), F(1)
    s = 0
    while abs(x) > F(1, 2) * 2**s:
        s += 1
    w = p + s + 12
    y = x / 2**s
    lo = _exp_series(down(y, w), w + 2)[0]
    hi = _exp_series(up(y, w), w + 2)[1]
    lo, hi = down(lo, w), up(hi, w)
    for _ in range(s):  # e^x = (e^(x/2^s))^(2^s); both ends are positive
        lo, hi = down(lo * lo, w), up(hi * hi, w)
    return down(lo, p), up(hi, p)


def _atanh_series(z: Fraction, bits: int) -> Interval:
    """``atanh(z)``, ``0 <= z <= 1/3``, to absolute error ``2^-bits``."""
    if z == 0:
        return F(0), F(0)
    total, power, k = F(0), z, 0
    z2 = z * z
    bound = F(1, 1 << bits)
    while True:
        total += power / (2 * k + 1)
        power *= z2
        k += 1
        tail = power / ((2 * k + 1) * (1 - z2))  # Σ_{j>=k} z^(2j+1)/(2j+1)
        if tail <= bound:
            return total, total + tail


def atanh_iv(z: Fraction, p: int) -> Interval:
    """``atanh(z)`` for ``|z| <= 1/3`` (atanh is odd and increasing)."""
    if z < 0:
        return iv_neg(atanh_iv(-z, p))
    w = p + 8
    lo = _atanh_series(down(z, w), w + 4)[0]
    hi = _atanh_series(up(z, w), w + 4)[1]
    return down(lo, p), up(hi, p)


@lru_cache(maxsize=64)
def ln2_iv(p: int) -> Interval:
    lo, hi = atanh_iv(F(1, 3), p + 4)
    return down(2 * lo, p), up(2 * hi, p)


def log_iv(y: Fraction, p: int) -> Interval:
    """An enclosure of ``log y`` (``y > 0`` rational) with about ``p`` correct bits."""
    if y <= 0:
        raise ValueError("log of a non-positive number")
    if y == 1:
        return F(0), F(0)
    e = floor_log2(y)
    f = y / F(2) ** e  # in [1, 2)
    if f >= F(3, 2):
        e, f = e + 1, f / 2  # in [3/4, 1)
    w = p + 8 + max(e, -e).bit_length()
    z = (f - 1) / (f + 1)  # in [-1/7, 1/5]
    a = atanh_iv(z, w)
    mantissa = (2 * a[0], 2 * a[1])
    l2 = ln2_iv(w)
    scaled = (e * l2[0], e * l2[1]) if e >= 0 else (e * l2[1], e * l2[0])
    return iv(mantissa[0] + scaled[0], mantissa[1] + scaled[1], p)


def _atan_series(z: Fraction, bits: int) -> Interval:
    """``atan(z)``, ``0 < z <= 1/5``, to absolute error ``2^-bits`` (alternating series)."""
    total, power, k = F(0), z, 0
    z2 = z * z
    bound = F(1, 1 << bits)
    while True:
        total += (-1) ** k * power / (2 * k + 1)
        power *= z2
        k += 1
        tail = power / (2 * k + 1)
        if tail <= bound:
            return total - tail, total + tail


@lru_cache(maxsize=64)
def pi_iv(p: int) -> Interval:
    """Machin: ``π = 16·atan(1/5) − 4·atan(1/239)``."""
    a = _atan_series(F(1, 5), p + 8)
    b = _atan_series(F(1, 239), p + 8)
    return down(16 * a[0] - 4 * b[1], p), up(16 * a[1] - 4 * b[0], p)


def _cos_sin_series(theta: Fraction, bits: int, sine: bool) -> Interval:
    """``cos θ`` or ``sin θ`` for ``0 <= θ <= 2`` (Lagrange remainder ``θ^n/n!``)."""
    total, n = F(0), 1 if sine else 0
    term = theta if sine else F(1)
    bound = F(1, 1 << bits)
    sign = 1
    while True:
        total += sign * term
        term = term * theta * theta / ((n + 1) * (n + 2))
        n += 2
        sign = -sign
        if term <= bound:  # the remainder after degree n-1 is at most θ^n/n! = term
            return total - term, total + term


def cos_2pi_iv(u: Fraction, p: int) -> Interval:
    """An enclosure of ``cos(2πu)`` for rational ``u`` in [0, 1)."""
    quarter = math.floor(4 * u)
    r = u - F(quarter, 4)  # in [0, 1/4): θ = 2πr in [0, π/2)
    sine = quarter % 2 == 1
    if r == 0:
        point = (F(0), F(0)) if sine else (F(1), F(1))
    else:
        w = p + 8
        pi_lo, pi_hi = pi_iv(w)
        theta_lo, theta_hi = 2 * r * pi_lo, 2 * r * pi_hi
        lo, hi = _cos_sin_series(theta_lo, w, sine)
        # |f(θ) − f(θ_lo)| <= θ − θ_lo for f = cos, sin (both 1-Lipschitz)
        point = lo - (theta_hi - theta_lo), hi + (theta_hi - theta_lo)
    # cos(2πu) is cos θ, −sin θ, −cos θ, sin θ in quarters 0, 1, 2, 3
    if quarter in (1, 2):
        point = iv_neg(point)
    return down(max(point[0], F(-1)), p), up(min(point[1], F(1)), p)


def sqrt_iv(a: Interval, p: int) -> Interval:
    """An enclosure of ``√x`` for ``x`` in the non-negative interval ``a``."""
    lo, hi = a
    if lo < 0:
        raise ValueError("sqrt of a negative number")

    def root(x: Fraction, upward: bool) -> Fraction:
        if x == 0:
            return x
        e = max(0, p - _log2_estimate(x) // 2 + 2)  # √x·2^e has about p bits
        scaled = x * F(4) ** e
        n = scaled.numerator // scaled.denominator
        if upward:
            n = -(-scaled.numerator // scaled.denominator)
            r = math.isqrt(n)
            if r * r < n:
                r += 1
            return F(r, 1 << e)
        return F(math.isqrt(n), 1 << e)

    return root(lo, False), root(hi, True)


def floor_if_certain(a: Interval) -> int | None:
    """``⌊t⌋`` for every ``t`` in ``a``, or ``None`` if the enclosure straddles an integer."""
    lo, hi = math.floor(a[0]), math.floor(a[1])
    return lo if lo == hi else None


def settle(decide: Callable[[int], T | None], uniforms: Sequence[Uniform]) -> T:
    """Retry ``decide(p)`` at growing precision, each time one more word of every uniform."""
    for level in range(MAX_LEVELS):
        p = 96 + 64 * level
        outcome = decide(p)
        if outcome is not None:
            return outcome
        for u in uniforms:
            u.extend()
    raise ArithmeticError("an outcome stayed undecided (this has probability < 2^-1000)")


def neg_log1m_iv(u: Interval, p: int) -> Interval | None:
    """An enclosure of ``−log(1 − U)`` for ``U`` in ``[lo, hi)``; ``None`` while ``hi = 1``."""
    lo, hi = u
    if hi >= 1:
        return None
    a = log_iv(1 - lo, p)  # log(1 − U) <= log(1 − lo)
    b = log_iv(1 - hi, p)  # log(1 − U) >= log(1 − hi)
    return -a[1], -b[0]


# --------------------------------------------------------------------------------------------
# §1.3 chains


def f64le(x: float) -> bytes:
    return struct.pack("<d", x)


def fingerprint(
    family: str, sealed: bool, sensitivity: float, dimension: int, levels: Sequence[float]
) -> bytes:
    """``SHA-256("emarket-chain-v2" ‖ u8(code) ‖ u8(sealed) ‖ f64le(Δ) ‖ u32le(d') ‖ …)[:16]``."""
    d_prime = dimension if family == "laplace" else 0
    message = (
        CHAIN_DOMAIN
        + bytes([FAMILY_CODES[family], int(sealed)])
        + f64le(sensitivity)
        + struct.pack("<I", d_prime)
        + b"".join(f64le(level) for level in levels)
    )
    return hashlib.sha256(message).digest()[:16]


def value_bytes(family: str, value: Sequence[float] | Sequence[int]) -> bytes:
    """The value's numbers as little-endian f64 (laplace, gaussian) or i64 (the others)."""
    if family in ("laplace", "gaussian"):
        return b"".join(f64le(float(x)) for x in value)
    return b"".join(struct.pack("<q", int(x)) for x in value)


def value_digest(family: str, value: Sequence[float] | Sequence[int]) -> str:
    return hashlib.sha256(value_bytes(family, value)).hexdigest()


def step_key(secret: bytes, fp: bytes, identity: Sequence[Part], j: int) -> bytes:
    """The request key of ``("emarket-chain-v2" (bytes), fingerprint (bytes), V…, j)``."""
    return request_key(secret, [CHAIN_DOMAIN, fp, *identity, j])


# --------------------------------------------------------------------------------------------
# §1.4 lattice Laplace


def lattice_grid(family: str, sensitivity: float, dimension: int) -> tuple[int, int]:
    """``(k, D)``: the grid exponent and the lattice sensitivity."""
    delta = F(sensitivity)
    if family == "discrete_laplace":
        if delta.denominator != 1:
            raise ValueError("discrete_laplace needs an integer sensitivity")
        return 0, int(delta)
    k = floor_log2(delta / dimension) - 12
    return k, math.floor(delta / F(2) ** k) + dimension


def encode_lattice(x: float, k: int) -> int:
    """``x/2^k`` rounded to the nearest integer, ties to even (exact)."""
    return round(F(x) / F(2) ** k)


def _mixture_weight(a_j: Fraction, a_next: Fraction, p: int) -> Interval:
    """``μ = e^{−(a_{j+1}−a_j)}·((1 − e^{−a_j})/(1 − e^{−a_{j+1}}))²``."""
    first = exp_iv(-(a_next - a_j), p)
    q_j, q_next = exp_iv(-a_j, p), exp_iv(-a_next, p)
    num = (1 - q_j[1], 1 - q_j[0])
    den = (1 - q_next[1], 1 - q_next[0])
    ratio = iv_div(num, den, p)
    return iv_mul(first, iv_mul(ratio, ratio, p), p)


def _side_weight(a: Fraction, a_next: Fraction | None, p: int) -> Interval:
    """``K_L = (1 − μ)·c·q/(1 − q)`` with ``c = tanh(a/2)``, ``q = e^{−a}``.

    ``tanh(a/2) = (1 − q)/(1 + q)``, so ``c·q/(1 − q) = q/(1 + q)``, increasing in ``q``.
    ``a_next`` is ``None`` for a fresh release (``μ = 0``), else ``a_{j+1}`` (a step).
    """
    q = exp_iv(-a, p)
    side = (q[0] / (1 + q[0]), q[1] / (1 + q[1]))
    if a_next is None:
        return iv(side[0], side[1], p)
    weight = _mixture_weight(a, a_next, p)
    return iv_mul((1 - weight[1], 1 - weight[0]), side, p)


def _geometric_floor(u: Uniform, s: Fraction) -> int:
    """``⌊−log(1 − U)/s⌋``."""

    def decide(p: int) -> int | None:
        e = neg_log1m_iv(u.interval, p)
        return None if e is None else floor_if_certain((e[0] / s, e[1] / s))

    return settle(decide, [u])


def _truncated_floor(u: Uniform, sigma: Fraction, width: int) -> int:
    """``⌊E/σ⌋`` with ``E = −log(1 − U·(1 − e^{−σ·2^b}))``."""

    def decide(p: int) -> int | None:
        lo, hi = u.interval
        w = p + 8
        ex = exp_iv(-sigma * 2**width, w)
        mass = (1 - ex[1], 1 - ex[0])  # 1 − e^{−σ·2^b}, in (0, 1)
        # 1 − U·A is in [1 − hi·A_hi, 1 − lo·A_lo], both positive
        small, large = down(1 - hi * mass[1], w), up(1 - lo * mass[0], w)
        if small <= 0:
            return None
        e_lo = -log_iv(large, w)[1]
        e_hi = -log_iv(small, w)[0]
        return floor_if_certain((e_lo / sigma, e_hi / sigma))

    return settle(decide, [u])


@dataclass(frozen=True)
class GeometricPlan:
    """The plan of ``Geom(e^{−s})``: ``M = 0`` is the plain plan (one slot)."""

    s: Fraction
    M: int
    widths: tuple[int, ...]

    @property
    def starts(self) -> tuple[int, ...]:
        out, acc = [], 0
        for b in self.widths:
            out.append(acc)
            acc += b
        return tuple(out)

    @property
    def slots(self) -> int:
        return 1 + len(self.widths)


def geometric_plan(s: Fraction) -> GeometricPlan:
    threshold = F(1, 1 << 20)
    if s >= threshold:
        return GeometricPlan(s, 0, ())
    m = 0
    while s * 2**m < threshold:
        m += 1
    c = -(-m // 20)
    widths = tuple(m // c + (1 if i < m % c else 0) for i in range(c))
    return GeometricPlan(s, m, widths)


def draw_geometric(draws: Draws, index: int, s: Fraction) -> int:
    """``G ~ Geom(e^{−s})`` from slots 1, 2, … of coordinate ``index``."""
    plan = geometric_plan(s)
    if plan.M == 0:
        return _geometric_floor(draws.uniform(1, index), s)
    g = (1 << plan.M) * _geometric_floor(draws.uniform(1, index), s * 2**plan.M)
    for i, (b, m) in enumerate(zip(plan.widths, plan.starts, strict=True)):
        r = _truncated_floor(draws.uniform(2 + i, index), s * 2**m, b)
        g += (1 << m) * r
    return g


def draw_lattice_laplace(draws: Draws, index: int, a: Fraction, a_next: Fraction | None) -> int:
    """``J`` (fresh, ``a_next`` None) or ``W_j`` (step, ``a_next = a_{j+1}``) by inversion."""
    u1 = draws.uniform(0, index)

    def decide(p: int) -> int | None:
        lo, hi = u1.interval
        kl = _side_weight(a, a_next, p)
        right = (1 - kl[1], 1 - kl[0])  # K_L + K_0 = 1 − K_R = 1 − K_L
        if hi <= kl[0]:
            return -1
        if lo >= kl[1] and hi <= right[0]:
            return 0
        if lo >= right[1]:
            return 1
        return None

    side = settle(decide, [u1])
    if side == 0:
        return 0
    g = draw_geometric(draws, index, a)
    return side * (1 + g)


# --------------------------------------------------------------------------------------------
# §1.5 Gaussian and §1.6 Poisson


def gaussian_variance(sensitivity: float, level: float) -> Fraction:
    return F(sensitivity) ** 2 / (2 * F(level))


def gaussian_grid(variance: Fraction) -> int:
    return floor_log2(variance) // 2 - 16


def _normal_iv(draws: Draws, index: int, p: int) -> Interval | None:
    """``√(−2·log U₁)·cos(2π·U₂)`` from slots 0 and 1."""
    u1_lo, u1_hi = draws.uniform(0, index).interval
    u2_lo, u2_hi = draws.uniform(1, index).interval
    if u1_lo == 0:
        return None  # −log U₁ unbounded so far
    w = p + 8
    # −2·log U₁ in [−2·log(hi), −2·log(lo)]; U₁ < hi <= 1
    top = log_iv(u1_lo, w)
    bottom = log_iv(u1_hi, w) if u1_hi < 1 else (F(0), F(0))
    radius = sqrt_iv((max(F(0), -2 * bottom[1]), -2 * top[0]), w)
    c = cos_2pi_iv(u2_lo, w)
    spread = 8 * (u2_hi - u2_lo)  # 2π·|U₂ − lo| <= 8·(hi − lo)
    angle = (max(F(-1), c[0] - spread), min(F(1), c[1] + spread))
    return iv_mul(radius, angle, w)


def gaussian_lattice(
    x: float, k: int, scales: Sequence[Fraction], draws: Sequence[Draws], index: int
) -> int:
    """``⌊(x + Σ √scale_i · N_i)/2^k + 1/2⌋``."""
    uniforms = [d.uniform(slot, index) for d in draws for slot in (0, 1)]

    def decide(p: int) -> int | None:
        total: Interval = (F(x), F(x))
        for scale, d in zip(scales, draws, strict=True):
            n = _normal_iv(d, index, p)
            if n is None:
                return None
            root = sqrt_iv((scale, scale), p + 8)
            total = iv_add(total, iv_mul(root, n, p + 8), p + 8)
        grid = F(2) ** k
        return floor_if_certain((total[0] / grid + F(1, 2), total[1] / grid + F(1, 2)))

    return settle(decide, uniforms)


def poisson_rate(sensitivity: float, level: float) -> Fraction:
    return F(sensitivity) ** 2 / F(level)


def draw_poisson(draws: Draws, index: int, mu: Fraction) -> int:
    """The least ``m >= 0`` with ``U < Σ_{i<=m} e^{−μ} μ^i/i!``."""
    if mu == 0:
        return 0
    u = draws.uniform(0, index)

    def decide(p: int) -> int | None:
        lo, hi = u.interval
        w = p + 8
        term = exp_iv(-mu, w)
        cdf = term
        m = 0
        while True:
            if hi <= cdf[0]:
                return m
            if lo < cdf[1]:
                return None
            m += 1
            term = iv(term[0] * mu / m, term[1] * mu / m, w)
            cdf = iv_add(cdf, term, w)

    return settle(decide, [u])


# --------------------------------------------------------------------------------------------
# §1.3 – §1.6 a whole chain


@dataclass
class ChainResult:
    fingerprint: bytes
    step_keys: list[bytes]
    integers: list[list[int]]
    releases: list[list[float]] | list[list[int]]
    grid_exponents: list[int] = field(default_factory=list)
    lattice_sensitivity: int | None = None


def _release(n: int, k: int) -> float:
    """The double nearest ``n·2^k`` (Python's int/int division is correctly rounded)."""
    return float(n * (1 << k)) if k >= 0 else n / (1 << -k)


def run_chain(
    secret: bytes,
    family: str,
    sensitivity: float,
    dimension: int,
    levels: Sequence[float],
    sealed: bool,
    value: Sequence[float] | Sequence[int],
    identity: Sequence[Part],
) -> ChainResult:
    """Every step's lattice integers and releases (step 0 first), top down."""
    if list(levels) != sorted(set(levels)):
        raise ValueError("levels must increase")
    n_levels = len(levels)
    fp = fingerprint(family, sealed, sensitivity, dimension, levels)
    keys = [step_key(secret, fp, identity, j) for j in range(n_levels)]
    n = len(value)
    draws = [Draws(key, n) for key in keys]
    integers: list[list[int]] = [[] for _ in levels]
    if family in ("laplace", "discrete_laplace"):
        k, big_d = lattice_grid(family, sensitivity, dimension)
        a = [F(level) / big_d for level in levels]
        if family == "laplace":
            top = [encode_lattice(float(x), k) for x in value]
        else:
            top = [int(x) for x in value]
        top = [t + draw_lattice_laplace(draws[-1], i, a[-1], None) for i, t in enumerate(top)]
        integers[-1] = top
        for j in range(n_levels - 2, -1, -1):
            integers[j] = [
                y + draw_lattice_laplace(draws[j], i, a[j], a[j + 1])
                for i, y in enumerate(integers[j + 1])
            ]
        if family == "laplace":
            releases: list[list[float]] | list[list[int]] = [
                [_release(y, k) for y in row] for row in integers
            ]
        else:
            releases = [list(row) for row in integers]
        return ChainResult(fp, keys, integers, releases, [k] * n_levels, big_d)
    if family == "gaussian":
        v = [gaussian_variance(sensitivity, level) for level in levels] + [F(0)]
        scales = [v[i] - v[i + 1] for i in range(n_levels)]
        ks = [gaussian_grid(v[j]) for j in range(n_levels)]
        for j in range(n_levels):
            integers[j] = [
                gaussian_lattice(float(x), ks[j], scales[j:], draws[j:], i)
                for i, x in enumerate(value)
            ]
        float_releases = [[_release(y, ks[j]) for y in row] for j, row in enumerate(integers)]
        return ChainResult(fp, keys, integers, float_releases, ks)
    if family == "poisson":
        lam = [poisson_rate(sensitivity, level) for level in levels] + [F(0)]
        integers[-1] = [int(x) + draw_poisson(draws[-1], i, lam[-2]) for i, x in enumerate(value)]
        for j in range(n_levels - 2, -1, -1):
            integers[j] = [
                y + draw_poisson(draws[j], i, lam[j] - lam[j + 1])
                for i, y in enumerate(integers[j + 1])
            ]
        return ChainResult(fp, keys, integers, [list(r) for r in integers], [0] * n_levels)
    raise ValueError(f"unknown family {family!r}")


# --------------------------------------------------------------------------------------------
# §1.7 the market's check

CHECK_CHAINS: tuple[tuple[str, float, tuple[float, ...]], ...] = (
    ("laplace", 1.0, (0.5, 1.0, 2.0)),
    ("gaussian", 1.0, (0.5, 1.0, 2.0)),
    ("poisson", 1.0, (0.01, 0.1, 1.0)),
    ("discrete_laplace", 1.0, (0.25, 1.0, 4.0)),
)


def check_value(family: str) -> list[float] | list[int]:
    if family in ("laplace", "gaussian"):
        return [-3 + 3 * i / 8 for i in range(16)]  # exact doubles
    if family == "poisson":
        return list(range(16))
    return list(range(-8, 8))


@lru_cache(maxsize=8)
def check_chain(family: str, sealed: bool) -> ChainResult:
    """One chain of the table in §1.7 (value identity ``("check",)``)."""
    delta, levels = {f: (d, lv) for f, d, lv in CHECK_CHAINS}[family]
    value = check_value(family)
    return run_chain(CHECK_SECRET, family, delta, len(value), levels, sealed, value, ["check"])


CHECK_ORDERS = ("per-family", "open-then-sealed")


def check_order(order: str = "per-family") -> list[tuple[str, bool]]:
    """The chains of §1.7 in the order they are hashed.

    ``"per-family"`` (each row of the table, open then sealed) reproduces the published
    constant; ``"open-then-sealed"`` (every row open, then every row sealed), the other reading
    of the sentence in §1.7, does not.
    """
    families = [f for f, _, _ in CHECK_CHAINS]
    if order == "per-family":
        return [(f, s) for f in families for s in (False, True)]
    if order == "open-then-sealed":
        return [(f, s) for s in (False, True) for f in families]
    raise ValueError(order)


def noise_check(order: str = "per-family") -> str:
    """SHA-256 from ``emarket-chain-v2`` over every step's release of every check chain."""
    digest = hashlib.sha256(CHAIN_DOMAIN)
    for family, sealed in check_order(order):
        for row in check_chain(family, sealed).releases:
            digest.update(value_bytes(family, row))
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# §1.9 histogram chains: the releases of one value, given the chain's public law

HISTOGRAM_DOMAIN = b"emarket-histogram-v2"


def histogram_fingerprint(
    sensitivity: float,
    domain: int,
    false_keys: float,
    grid: int,
    levels: Sequence[float],
    cells: int,
) -> bytes:
    """``SHA-256("emarket-histogram-v2" ‖ f64le(Δ) ‖ u64le(d) ‖ f64le(m) ‖ u32le(G) ‖ levels ‖
    "graded-v1" ‖ u32le(cells))``, first 16 bytes."""
    message = (
        HISTOGRAM_DOMAIN
        + f64le(sensitivity)
        + struct.pack("<Q", domain)
        + f64le(false_keys)
        + struct.pack("<I", grid)
        + b"".join(f64le(level) for level in levels)
        + b"graded-v1"
        + struct.pack("<I", cells)
    )
    return hashlib.sha256(message).digest()[:16]


@dataclass
class HistogramStep:
    """Step ``s`` of the public law, as §1.9 lists it."""

    tau: float
    a: float
    sd: float
    p: float
    grid_exponent: int
    centres: list[float] | None
    widths: list[float] | None
    cdf: list[float] | None


def _iv_exp(a: Interval, p: int) -> Interval:
    """``e^x`` over an enclosure (increasing)."""
    return exp_iv(down(a[0], p), p)[0], exp_iv(up(a[1], p), p)[1]


def _iv_sqrt_of(x: Fraction, p: int) -> Interval:
    return sqrt_iv((x, x), p)


def _binomial_count(u: Uniform, n: int, prob: Fraction, limit: int) -> int:
    """The least ``j`` with ``U < Σ_{i ≤ j} C(n, i) p^i (1 − p)^{n−i}`` (at most ``limit + 1``)."""

    def decide(p: int) -> int | None:
        lo, hi = u.interval
        w = p + 16
        log_q = log_iv(1 - prob, w)
        pmf = _iv_exp(iv(n * log_q[0], n * log_q[1], w), w)
        cdf = pmf
        j = 0
        while True:
            if hi <= cdf[0]:
                return j
            if lo < cdf[1]:
                return None
            if j >= min(n, limit + 1):
                return j
            ratio = F(n - j, j + 1) * prob / (1 - prob)
            pmf = iv(pmf[0] * ratio, pmf[1] * ratio, w)
            cdf = iv_add(cdf, pmf, w)
            j += 1

    return settle(decide, [u])


def _new_keys(draws: Draws, q: int, tracked: set[int], domain: int) -> list[int]:
    """Main words in turn, their top ``b`` bits, kept if below ``d`` and new."""
    b = (domain - 1).bit_length()
    out: list[int] = []
    t = 0
    while len(out) < q:
        w = draws.main_word(t)
        t += 1
        j = w >> (64 - b) if b else 0
        if j < domain and j not in tracked and j not in out:
            out.append(j)
    return out


def _cell_of(u: Uniform, cdf: Sequence[float]) -> int:
    """The least ``c`` with ``U < cdf_c``."""

    def decide(p: int) -> int | None:
        lo, hi = u.interval
        for c, edge in enumerate(cdf):
            if hi <= F(edge):
                return c
            if lo < F(edge):
                return None
        raise ArithmeticError("the last cdf entry is not 1")

    return settle(decide, [u])


@dataclass
class _NewStart:
    """``S = a − h·(1 − U_x) + σ·E/λ`` with its two uniforms."""

    a: Fraction
    h: Fraction
    var: Fraction
    lam: Fraction
    ux: Uniform
    ue: Uniform

    def enclose(self, p: int) -> Interval | None:
        lo_e, hi_e = self.ue.interval
        if lo_e == 0:
            return None
        e = (-log_iv(hi_e, p)[1], -log_iv(lo_e, p)[0]) if hi_e < 1 else (F(0), -log_iv(lo_e, p)[0])
        sigma = _iv_sqrt_of(self.var, p)
        shift = iv_div(iv_mul(sigma, e, p), (self.lam, self.lam), p)
        lo_x, hi_x = self.ux.interval
        back = (self.h * (1 - hi_x), self.h * (1 - lo_x))
        return iv_add(iv_sub((self.a, self.a), back, p), shift, p)


def _start_of(
    secret: bytes,
    base: list[Part],
    s: int,
    e: int,
    step: HistogramStep,
    var: Fraction,
    cell: tuple[Fraction, Fraction],
) -> _NewStart:
    """Robert's trials of new key ``e`` from its cell ``(r, h)``, each decided exactly."""
    right, width = cell
    b = (step.a - float(right)) / step.sd
    lam = F((b + math.sqrt(b * b + 4.0)) / 2.0)
    a = F(step.a)
    t = 0
    while True:
        draws = Draws(request_key(secret, [*base, s, "start", e, t]), 1)
        ux, ue, uv = draws.uniform(0, 0), draws.uniform(1, 0), draws.uniform(2, 0)
        start = _NewStart(a, width, var, lam, ux, ue)

        def decide(p: int, start: _NewStart = start, uv: Uniform = uv) -> bool | None:
            enclosed = start.enclose(p)
            if enclosed is None:
                return None
            sigma = _iv_sqrt_of(var, p)
            over = iv_sub(enclosed, (a, a), p)  # S − a = σE/λ − h(1 − U_x)
            # y − λ = (a − r)/σ + E/λ − λ, and E/λ = (S − a + h(1 − U_x))/σ
            lo_x, hi_x = start.ux.interval
            back = (width * (1 - hi_x), width * (1 - lo_x))
            e_over_lam = iv_div(iv_add(over, back, p), sigma, p)
            dev = iv_sub(
                iv_add(iv_div((a - right, a - right), sigma, p), e_over_lam, p), (lam, lam), p
            )
            sq_hi = max(dev[0] * dev[0], dev[1] * dev[1])
            sq_lo = F(0) if dev[0] <= 0 <= dev[1] else min(dev[0] * dev[0], dev[1] * dev[1])
            bound = _iv_exp((-sq_hi / 2, -sq_lo / 2), p)
            lo_v, hi_v = uv.interval
            if lo_v >= bound[1]:
                return False
            if hi_v > bound[0]:
                return None
            if over[0] > 0:
                return True
            if over[1] <= 0:
                return False
            return None

        if settle(decide, [ux, ue, uv]):
            return start
        t += 1


def run_histogram(secret: bytes, vector: dict[str, Any]) -> list[tuple[list[int], list[float]]]:
    """The releases at every step of the vector's value, from its public law and §1.9."""
    levels = [float.fromhex(x) for x in vector["levels"]]
    delta = float.fromhex(vector["sensitivity"])
    domain = int(vector["domain"])
    keys = [int(k) for k in vector["keys"]]
    counts = [float.fromhex(c) for c in vector["counts"]]
    fp = histogram_fingerprint(
        delta, domain, float.fromhex(vector["false_keys"]), vector["grid"], levels, vector["cells"]
    )
    base: list[Part] = [HISTOGRAM_DOMAIN, fp, *(p[1] for p in vector["identity"])]
    law = [
        HistogramStep(
            float.fromhex(st["threshold"]),
            float.fromhex(st["a"]),
            float.fromhex(st["sd"]),
            float.fromhex(st["p"]),
            st["grid_exponent"],
            None if st["cells"] is None else [float.fromhex(x) for x in st["cells"]["centres"]],
            None if st["cells"] is None else [float.fromhex(x) for x in st["cells"]["widths"]],
            None if st["cells"] is None else [float.fromhex(x) for x in st["cells"]["cdf"]],
        )
        for st in vector["law"]
    ]
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    tracked = [keys[i] for i in order]
    exact = [F(counts[i]) for i in order]
    starts: dict[int, _NewStart] = {}
    walks: list[tuple[Draws, int, Fraction]] = []  # per step: its draws, n_s, σ_s²
    limit = vector["max_false_keys"]
    out = []
    for s, step in enumerate(law):
        n_s = len(tracked)
        prev = F(levels[s - 1]) if s else F(0)
        var = F(delta) ** 2 * (F(levels[s]) - prev) / 2
        walks.append((Draws(request_key(secret, [*base, s, "walk"]), n_s), n_s, var))
        q = 0
        if step.p > 0 and n_s < domain:
            u = Draws(request_key(secret, [*base, s, "count"]), 1).uniform(0, 0)
            q = _binomial_count(u, domain - n_s, F(step.p), limit - (n_s - len(keys)))
        fresh = (
            _new_keys(Draws(request_key(secret, [*base, s, "keys"]), q), q, set(tracked), domain)
            if q
            else []
        )
        cells = Draws(request_key(secret, [*base, s, "cell"]), max(q, 1))
        for e, key in enumerate(fresh):
            if step.cdf is None or step.centres is None or step.widths is None:
                cell = (F(0), F(0))
            else:
                c = _cell_of(cells.uniform(0, e), step.cdf)
                cell = (F(step.centres[c]) + F(step.widths[c]) / 2, F(step.widths[c]))
            starts[len(tracked)] = _start_of(secret, base, s, e, step, var, cell)
            tracked.append(key)
            exact.append(F(0))
        out.append(_histogram_release(tracked, exact, starts, walks, F(levels[s]), step))
    return out


def _histogram_release(
    tracked: list[int],
    exact: list[Fraction],
    starts: dict[int, _NewStart],
    walks: list[tuple[Draws, int, Fraction]],
    level: Fraction,
    step: HistogramStep,
) -> tuple[list[int], list[float]]:
    k = step.grid_exponent
    shown = []
    for i, key in enumerate(tracked):
        parts = [(d, var) for d, n, var in walks if i < n]
        start = starts.get(i)
        uniforms = [d.uniform(slot, i) for d, _ in parts for slot in (0, 1)]
        if start is not None:
            uniforms += [start.ux, start.ue]

        def decide(
            p: int,
            i: int = i,
            parts: list[tuple[Draws, Fraction]] = parts,
            start: _NewStart | None = start,
        ) -> int | None:
            total: Interval = (F(0), F(0))
            if start is not None:
                enclosed = start.enclose(p)
                if enclosed is None:
                    return None
                total = enclosed
            for d, var in parts:
                nrm = _normal_iv(d, i, p)
                if nrm is None:
                    return None
                total = iv_add(total, iv_mul(_iv_sqrt_of(var, p + 8), nrm, p + 8), p + 8)
            scaled = iv_add((exact[i], exact[i]), iv_div(total, (level, level), p + 8), p + 8)
            grid = F(2) ** k
            return floor_if_certain((scaled[0] / grid + F(1, 2), scaled[1] / grid + F(1, 2)))

        n = settle(decide, uniforms)
        if n * F(2) ** k > F(step.tau):
            shown.append((key, _release(n, k)))
    shown.sort()
    return [key for key, _ in shown], [value for _, value in shown]
