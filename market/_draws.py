"""The random bits every sampler consumes (noise format v2): one ChaCha20 stream per request.

A sampler never sees a numpy ``Generator``: it takes a :class:`Draws`, the keystream of one
*request key* ``K`` (32 bytes), read as little-endian unsigned 64-bit words. The layout is part
of the noise format (``docs/protocol.md``, "Noise format v2"), so any implementation in any
language draws the same bits:

* **main words**: ChaCha20 (RFC 8439) keyed by ``K``, nonce 12 zero bytes, block counter from 0.
  A sampler of ``n`` coordinates with ``S`` *slots* (uniforms per coordinate) reads words
  ``0 … S·n − 1``; slot ``s`` of coordinate ``i`` is word ``s·n + i`` (slot-major, so a slot is
  one contiguous block for the vectorised float pass). Every law fixes its ``S`` from public
  parameters only, so the bits a coordinate uses never depend on the data or on other
  coordinates.
* **extension words** of slot ``s`` of coordinate ``i``: ChaCha20 keyed by ``K`` with nonce
  ``0x01 ‖ u8(s) ‖ 0x0000 ‖ u64le(i)``, words in order. A word ``w`` is the first 64 bits of an
  ideal uniform ``U ∈ [w·2⁻⁶⁴, (w + 1)·2⁻⁶⁴)``; the extension words are its next bits, read only
  by the rare coordinate whose outcome the float pass cannot decide (:class:`LazyUniform`).

Where ``K`` comes from is the caller's business: the market's chains derive it from the noise
secret and the request (:func:`request_key`, SHAKE256), a :class:`~market.ReleaseState` draws
it from the caller's generator (:func:`key_from`). One SHAKE256 call and one ChaCha20 call per
request: about 5 µs for a short vector (the format-v1 derivation, an HMAC, an AES re-key and a
numpy generator, cost ~45 µs), and ChaCha20 runs at several GB/s for long ones.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import struct
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from numpy.typing import NDArray

if TYPE_CHECKING:
    from _hashlib import HASHXOF

__all__ = [
    "KEY_LABEL",
    "Draws",
    "LazyUniform",
    "key_from",
    "keyed_sponge",
    "lazy_at",
    "request_key",
    "to_unit",
    "word_at",
]

KEY_LABEL = b"emarket-noise-v2\x00"
"""Domain separation of request keys (changing it changes every release)."""
_MAIN_NONCE = bytes(16)  # cryptography's ChaCha20 nonce: u32le block counter ‖ 96-bit nonce
_U53 = 2.0**-53


def request_key(secret: bytes, seed: bytes) -> bytes:
    """The request key of ``seed`` under ``secret``: ``SHAKE256(label ‖ u32be(|secret|) ‖ secret
    ‖ seed)``, first 32 bytes.

    SHAKE256 keyed by a prefix is a pseudo-random function (the sponge has no length
    extension), so keys of different requests look independent and reveal nothing of the
    secret; the length prefix keeps ``(secret, seed)`` pairs from colliding.

    Parameters
    ----------
    secret : bytes
        At least 16 secret bytes.
    seed : bytes
        The request's canonical identity (:func:`market.rng.identity_bytes`).
    """
    h = keyed_sponge(secret)
    h.update(seed)
    return h.digest(32)


def keyed_sponge(secret: bytes) -> HASHXOF:
    """SHAKE256 after absorbing ``label ‖ u32be(|secret|) ‖ secret``: :func:`request_key`'s
    state before the seed, to copy for many seeds."""
    if len(secret) < 16:
        raise ValueError("the noise secret must be at least 16 bytes")
    h = hashlib.shake_256(KEY_LABEL)
    h.update(struct.pack(">I", len(secret)))
    h.update(secret)
    return h


def key_from(rng: np.random.Generator) -> bytes:
    """A request key drawn from a caller's generator (32 bytes of :meth:`Generator.bytes`)."""
    return rng.bytes(32)


def _keystream(key: bytes, nonce: bytes, nbytes: int) -> bytes:
    """``nbytes`` of ChaCha20 keystream (the encryption of zeros)."""
    enc = Cipher(algorithms.ChaCha20(key, nonce), None).encryptor()
    return enc.update(_zeros(nbytes))


_ZEROS = [bytes(1 << 16)]


def _zeros(nbytes: int) -> memoryview:
    """``nbytes`` zero bytes, from one buffer kept and grown (a fresh one cost a page fault per
    4 kB: 15 of the 20 ms of 16 MB of keystream)."""
    if len(_ZEROS[0]) < nbytes:
        _ZEROS[0] = bytes(max(nbytes, 2 * len(_ZEROS[0])))
    return memoryview(_ZEROS[0])[:nbytes]


def _words(key: bytes, count: int) -> NDArray[np.uint64]:
    """The first ``count`` main words of ``key``, written straight into a new array."""
    out = np.empty(count + 2, dtype="<u8")  # update_into needs 15 bytes of slack
    enc = Cipher(algorithms.ChaCha20(key, _MAIN_NONCE), None).encryptor()
    enc.update_into(_zeros(8 * count), out.view(np.uint8).data)
    words: NDArray[np.uint64] = np.asarray(out[:count], dtype=np.uint64)  # native order
    return words


class Draws:
    """The main and extension words of one or more request keys (see the module docstring).

    Parameters
    ----------
    key : bytes
        The 32-byte request key.
    n : int
        Coordinates of the sample (the stride between slots).
    slots : int
        Words per coordinate the law reads in the main stream.

    Notes
    -----
    :meth:`joined` concatenates the draws of several requests (one per value of a batch) slot by
    slot, so one vectorised pass serves them all while each coordinate reads exactly the words
    it would read alone; :meth:`lazy` maps a coordinate back to its own key and index.

    Examples
    --------
    >>> d = Draws(bytes(32), n=3, slots=2)
    >>> d.slot(1).shape
    (3,)
    >>> int(d.slot(0)[0]) == word_at(bytes(32), 0)
    True
    """

    __slots__ = ("_offsets", "_segments", "_words", "n", "slots")

    def __init__(self, key: bytes, n: int, slots: int) -> None:
        if len(key) != 32:
            raise ValueError("a request key has 32 bytes")
        self.n, self.slots = n, slots
        self._words: NDArray[np.uint64] = _words(key, n * slots).reshape(slots, n)
        self._segments: list[tuple[bytes, int]] = [(key, n)]
        self._offsets = [0]

    @classmethod
    def joined(cls, parts: list[Draws]) -> Draws:
        """The draws of several requests side by side (equal slots)."""
        if len(parts) == 1:
            return parts[0]
        if len({p.slots for p in parts}) > 1:
            raise ValueError("joined draws need the same slots")
        out = object.__new__(cls)
        out.n, out.slots = sum(p.n for p in parts), parts[0].slots
        out._words = np.concatenate([p._words for p in parts], axis=1)
        out._segments = [seg for p in parts for seg in p._segments]
        out._offsets = list(itertools.accumulate([seg[1] for seg in out._segments[:-1]], initial=0))
        return out

    @classmethod
    def from_words(cls, segments: list[tuple[bytes, int]], words: NDArray[np.uint64]) -> Draws:
        """Draws whose main words were computed elsewhere (:mod:`market._step`): ``words`` is
        the ``(slots, n)`` array :meth:`joined` would hold for the requests ``segments``
        (``(key, coordinates)`` each, in order)."""
        out = object.__new__(cls)
        out.slots, out.n = words.shape
        offsets = list(itertools.accumulate([n for _, n in segments], initial=0))
        if out.n != offsets.pop():
            raise ValueError("the words do not hold the segments' coordinates")
        out._words = words
        out._segments = segments
        out._offsets = offsets
        return out

    @property
    def words(self) -> NDArray[np.uint64]:
        """Every main word, ``(slots, n)``: slot ``s`` of coordinate ``i`` at ``[s, i]``."""
        return self._words

    @property
    def key(self) -> bytes:
        """The request key (of the first request, for joined draws)."""
        return self._segments[0][0]

    def slot(self, s: int) -> NDArray[np.uint64]:
        """Slot ``s`` of every coordinate (a read-only view of ``n`` words)."""
        if not 0 <= s < self.slots:
            raise IndexError(f"slot {s} of a law with {self.slots} slots")
        words: NDArray[np.uint64] = self._words[s]
        return words

    def locate(self, i: int) -> tuple[bytes, int, int]:
        """``(key, n, index)`` of coordinate ``i`` within its own request."""
        seg = bisect.bisect_right(self._offsets, i) - 1
        key, n = self._segments[seg]
        return key, n, i - self._offsets[seg]

    def lazy(self, s: int, i: int) -> LazyUniform:
        """The ideal uniform of slot ``s`` of coordinate ``i``, extensible on demand."""
        key, _, index = self.locate(i)
        return LazyUniform(int(self._words[s, i]), key, s, index)


def word_at(key: bytes, index: int) -> int:
    """Main word ``index`` of a request key, read alone (ChaCha20 seeks by block counter)."""
    block, offset = divmod(index, 8)
    raw = _keystream(key, struct.pack("<I", block) + bytes(12), 64)
    return int.from_bytes(raw[8 * offset : 8 * offset + 8], "little")


def lazy_at(key: bytes, n: int, slot: int, i: int) -> LazyUniform:
    """:meth:`Draws.lazy` without drawing the other coordinates' words."""
    return LazyUniform(word_at(key, slot * n + i), key, slot, i)


class LazyUniform:
    """An ideal uniform in [0, 1) known to ``bits`` binary digits, extended 64 bits at a time.

    Parameters
    ----------
    word : int
        Its first 64 bits (the main word of its slot and coordinate).
    key : bytes
        The request key.
    slot, index : int
        Select the extension stream (nonce ``0x01 ‖ u8(slot) ‖ 0x0000 ‖ u64le(index)``).
    """

    __slots__ = ("_ext", "_key", "_nonce", "_used", "bits", "num")

    def __init__(self, word: int, key: bytes, slot: int, index: int) -> None:
        self.num, self.bits = word, 64
        self._key = key
        self._nonce = struct.pack("<IBBHQ", 0, 1, slot, 0, index)
        self._ext = b""
        self._used = 0

    def bounds(self) -> tuple[Fraction, Fraction]:
        """``[lo, hi)`` holding the uniform."""
        return Fraction(self.num, 1 << self.bits), Fraction(self.num + 1, 1 << self.bits)

    def refine(self) -> None:
        """Append the next 64 bits of the extension stream."""
        if self._used + 8 > len(self._ext):
            self._ext = _keystream(self._key, self._nonce, 8 * (self._used // 8 + 8))
        word = int.from_bytes(self._ext[self._used : self._used + 8], "little")
        self._used += 8
        self.num = (self.num << 64) | word
        self.bits += 64


def to_unit(words: NDArray[np.uint64]) -> NDArray[np.float64]:
    """The 53-bit prefixes ``⌊w / 2¹¹⌋·2⁻⁵³`` of uniforms, exactly, as floats in [0, 1).

    The ideal uniform lies in ``[u, u + 2⁻⁵³)``.
    """
    top = words >> np.uint64(11)  # < 2⁵³: the same integer read as int64, which converts faster
    unit = top.view(np.int64).astype(np.float64)
    unit *= _U53
    return unit
