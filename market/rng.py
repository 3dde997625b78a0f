"""Sources of randomness for differential-privacy noise.

Two rules shape this module:

* **Noise must come from a cryptographically strong stream.** A statistical PRNG such as PCG64 or
  the Mersenne Twister is predictable from its outputs; anyone who can reconstruct the stream can
  subtract the noise. We therefore drive numpy's :class:`numpy.random.Generator` with
  :class:`randomgen.AESCounter` (AES-128 in counter mode, the construction behind NIST's
  CTR_DRBG), keyed from the operating system's CSPRNG. With AES-NI it is as fast as PCG64, so
  every numpy sampler (Laplace, normal, Poisson, binomial) is available at full speed.
* **Replays must reproduce releases bit for bit.** :func:`keyed_rng` derives the AES key with
  HMAC-SHA256 from a long-term secret and the identity of the request (stream, value, level), so
  re-running the same request against the same stored state yields the identical release. The
  secret is as sensitive as the exact values: whoever holds it and the state can recompute noise.

Tests pass explicit integer seeds (:func:`default_rng`); the service never does.

Note that numpy does not promise a stable bit stream across versions. Nothing here is meant to
*regenerate* an old release from a seed later: the release state stores every released vector,
and :func:`keyed_rng` only matters for re-running a request whose result was never stored.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import struct
from functools import lru_cache

import numpy as np
from randomgen import AESCounter

__all__ = [
    "Identity",
    "KeyedRngFactory",
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


@lru_cache(maxsize=65_536)
def _text(part: str) -> bytes:
    """A string part's encoding (cached: a value's identity repeats at every step)."""
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


def keyed_rng(secret: bytes, *identity: IdentityPart) -> np.random.Generator:
    """A generator whose stream is a deterministic function of ``secret`` and ``identity``.

    Parameters
    ----------
    secret : bytes
        At least 16 secret bytes; as sensitive as the exact values (with it, noise can be
        recomputed).
    *identity : str, bytes, int or float
        The request's identity, encoded by :func:`identity_bytes`.

    Returns
    -------
    numpy.random.Generator
        AES-128-CTR keyed with ``HMAC-SHA256(secret, identity)`` truncated to 128 bits. HMAC is
        a PRF, so different identities give independent-looking streams and the secret cannot
        be recovered from the noise.

    Examples
    --------
    >>> a = keyed_rng(b"s" * 32, "stream", "value", 1.0).random()
    >>> a == keyed_rng(b"s" * 32, "stream", "value", 1.0).random()
    True
    """
    if len(secret) < 16:
        raise ValueError("the noise secret must be at least 16 bytes")
    digest = hmac.new(secret, identity_bytes(*identity), hashlib.sha256).digest()
    return np.random.Generator(AESCounter(key=int.from_bytes(digest[:16], "little")))


class KeyedRngFactory:
    """:func:`keyed_rng` without the cost of building a generator per request.

    Parameters
    ----------
    secret : bytes
        At least 16 secret bytes.

    Notes
    -----
    Re-keys one AES-CTR bit generator in place (about 3x faster than constructing one), which
    matters when every released value needs its own deterministic stream. The generator returned
    by a call is the same object each time: draw from it before the next call. That is why only
    :mod:`market` calls it, item by item (:meth:`ReleaseState.release_across`); callers hand
    over identities, never a callback. Not thread-safe.
    """

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the noise secret must be at least 16 bytes")
        self._secret = secret
        self._bits = AESCounter(key=0)
        self._gen = np.random.Generator(self._bits)

    def __call__(self, *identity: IdentityPart) -> np.random.Generator:
        digest = hmac.digest(self._secret, identity_bytes(*identity), "sha256")
        self._bits.seed(key=int.from_bytes(digest[:16], "little"))
        return self._gen


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
