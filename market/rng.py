"""Sources of randomness for differential-privacy noise.

Two rules shape this module:

* **Noise must come from a cryptographically strong stream.** Every sampler reads the ChaCha20
  keystream of a 32-byte *request key* (:mod:`market._draws`): a statistical PRNG such as PCG64
  or the Mersenne Twister is predictable from its outputs, and whoever reconstructs the stream
  can subtract the noise. A library caller's :class:`numpy.random.Generator` only supplies the
  request key; by default it runs AES-128 in counter mode keyed from the operating system's
  CSPRNG (:func:`secure_rng`).
* **Replays must reproduce releases bit for bit.** :class:`NoiseKeys` derives request keys
  from a long-term secret and the identity of the request (stream, value, level) with SHAKE256,
  so re-running the same request yields the identical release, on any machine. The secret is as
  sensitive as the exact values: whoever holds it and the values can recompute the noise.

Tests pass explicit integer seeds (:func:`default_rng`); the service never does.
"""

from __future__ import annotations

import math
import os
import struct
from typing import TYPE_CHECKING

import numpy as np
from randomgen import AESCounter

from ._draws import keyed_sponge

if TYPE_CHECKING:
    from _hashlib import HASHXOF

__all__ = [
    "Identity",
    "KeyedRngFactory",
    "NoiseKeys",
    "RngLike",
    "default_rng",
    "identity_bytes",
    "keyed_rng",
    "secure_rng",
]

IdentityPart = str | bytes | int | float
Identity = tuple[IdentityPart, ...]
"""The identity of a request whose noise must be a function of it (see :func:`keyed_rng`)."""

RngLike = np.random.Generator | int | None
"""What public APIs accept as ``rng``: a Generator (used as is), an int seed (tests only) or
``None`` (a fresh cryptographically keyed generator)."""


def secure_rng() -> np.random.Generator:
    """A fresh, unpredictable generator for privacy noise.

    Returns
    -------
    numpy.random.Generator
        Over AES-128 in counter mode keyed with 128 bits from ``os.urandom``: every numpy
        sampler at full speed, and a stream nobody can predict from earlier outputs.
    """
    key = int.from_bytes(os.urandom(16), "little")
    return np.random.Generator(AESCounter(key=key))


def identity_bytes(*parts: IdentityPart) -> bytes:
    """Canonical, unambiguous encoding of a request identity.

    Each part is type-tagged and length-prefixed so that ``("ab", "c")`` and ``("a", "bc")``
    can never collide. Floats are encoded by their IEEE-754 bits (levels are canonicalised
    before they reach here, see :func:`market.levels.canonical_level`).
    """
    return b"".join([_part(part) for part in parts])


def _text(part: str) -> bytes:
    """A string part's encoding (not cached: value ids and digests are unique, and a cache of
    them grew every worker by ~300 bytes a value until it filled)."""
    data = part.encode("utf-8")
    return b"s" + struct.pack(">I", len(data)) + data


def _part(part: IdentityPart) -> bytes:
    if type(part) is str:
        return _text(part)
    if isinstance(part, bytes):
        tag, data = b"b", part
    elif isinstance(part, str):
        tag, data = b"s", part.encode("utf-8")
    elif isinstance(part, bool):
        raise TypeError("booleans are not valid identity parts")
    elif isinstance(part, int):
        tag, data = b"i", str(part).encode("ascii")
    elif isinstance(part, float):
        if not math.isfinite(part):
            raise ValueError(f"identity part must be finite, got {part!r}")
        tag, data = b"f", struct.pack(">d", part)
    else:
        raise TypeError(f"unsupported identity part type {type(part).__name__}")
    return tag + struct.pack(">I", len(data)) + data


class NoiseKeys:
    """Request keys as a function of a secret and the request's identity.

    Parameters
    ----------
    secret : bytes
        At least 16 secret bytes; as sensitive as the exact values.

    Notes
    -----
    ``keys(*identity)`` is :func:`market._draws.request_key` of the secret and
    :func:`identity_bytes` of the identity: ``SHAKE256("emarket-noise-v2\\0" ‖ u32be(len) ‖
    secret ‖ identity)``, first 32 bytes (``docs/protocol.md``, "Noise format v2"). SHAKE256
    keyed by a prefix is a pseudo-random function, so different identities get independent
    keys and the noise reveals nothing of the secret.

    Examples
    --------
    >>> keys = NoiseKeys(b"s" * 32)
    >>> keys("stream", "value", 1.0) == keys("stream", "value", 1.0) != keys("stream", "v2", 1.0)
    True
    """

    __slots__ = ("_base", "_secret")
    _base: HASHXOF

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the noise secret must be at least 16 bytes")
        self._secret = secret
        self._base = keyed_sponge(secret)

    def __call__(self, *identity: IdentityPart) -> bytes:
        return self.of(identity_bytes(*identity))

    @property
    def secret(self) -> bytes:
        """The secret (the compiled noise step absorbs it itself: :mod:`market._step`)."""
        return self._secret

    def of(self, seed: bytes) -> bytes:
        """The request key of an identity already encoded (:func:`identity_bytes`): the
        sponge that absorbed the label and the secret is copied, not rebuilt, per key."""
        h = self._base.copy()
        h.update(seed)
        return h.digest(32)


class KeyedRngFactory:
    """numpy generators keyed by request keys: :func:`keyed_rng` without building one per call.

    Parameters
    ----------
    secret : bytes
        At least 16 secret bytes.

    Notes
    -----
    For callers that draw through a numpy generator (none of the market's chains: a histogram
    chain given a factory reads the request keys of :attr:`keys`). Re-keys one
    AES-CTR bit generator in place with the first 16 bytes of the request key; the generator
    returned by a call is the same object each time: draw from it before the next call. Not
    thread-safe.
    """

    def __init__(self, secret: bytes) -> None:
        self._keys = NoiseKeys(secret)
        self._bits = AESCounter(key=0)
        self._gen = np.random.Generator(self._bits)

    @property
    def keys(self) -> NoiseKeys:
        """The request keys of the same secret (for samplers that read keystreams)."""
        return self._keys

    def __call__(self, *identity: IdentityPart) -> np.random.Generator:
        self._bits.seed(key=int.from_bytes(self._keys(*identity)[:16], "little"))
        return self._gen


def keyed_rng(secret: bytes, *identity: IdentityPart) -> np.random.Generator:
    """A generator whose stream is a deterministic function of ``secret`` and ``identity``.

    For library callers who want :meth:`ReleaseState.release` to be a function of the request:
    it draws its request key from this generator.

    Parameters
    ----------
    secret : bytes
        At least 16 secret bytes.
    *identity : str, bytes, int or float
        The request's identity (:func:`identity_bytes`).

    Returns
    -------
    numpy.random.Generator
        AES-128-CTR keyed with the first 16 bytes of the request key :class:`NoiseKeys`
        derives.

    Examples
    --------
    >>> a = keyed_rng(b"s" * 32, "stream", "value", 1.0).random()
    >>> a == keyed_rng(b"s" * 32, "stream", "value", 1.0).random()
    True
    """
    key = NoiseKeys(secret)(*identity)
    return np.random.Generator(AESCounter(key=int.from_bytes(key[:16], "little")))


def default_rng(rng: RngLike = None) -> np.random.Generator:
    """Normalise an ``rng`` argument, in the spirit of :func:`numpy.random.default_rng`.

    Parameters
    ----------
    rng : Generator, int or None
        ``None`` gives :func:`secure_rng`; an ``int`` gives a reproducible AES-CTR stream seeded
        through :class:`numpy.random.SeedSequence` (tests and benchmarks only); a
        :class:`numpy.random.Generator` is returned untouched.

    Returns
    -------
    numpy.random.Generator

    Raises
    ------
    TypeError
        Anything else (a bool is not a seed).
    """
    if rng is None:
        return secure_rng()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, bool) or not isinstance(rng, int):
        raise TypeError(f"rng must be None, an int seed or a numpy Generator, not {type(rng)!r}")
    return np.random.Generator(AESCounter(np.random.SeedSequence(rng)))
