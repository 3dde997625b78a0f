"""The test vectors of ``docs/protocol.md`` §1 (noise format v2), as this implementation makes them.

``python -m tests.market.protocol_vectors`` prints them as the JSON block the document carries;
``tests/market/test_protocol_vectors.py`` checks that the document's block equals what the code
computes now, and that an independent implementation written from the document alone
(``tests/market/reference_noise.py``) computes the same.
"""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal, getcontext
from fractions import Fraction
from typing import Any

import numpy as np

from market import DiscreteLaplace, Gaussian, Laplace, Mechanism, Poisson, _dlap, _poisson
from market._draws import Draws, LazyUniform, request_key
from market.chain import ReleaseChain, noise_check
from market.histogram_chain import HistogramChain, noise_check_histogram
from market.rappor import released_bits
from market.rng import NoiseKeys, identity_bytes

SECRET = bytes(range(32))
MASK = 2**64 - 1
FLOATS = [20.1, 19.8, 21.0, 20.4]
RAPPOR = "rappor: a category report (laplace, Δ = 2, d = 8), and its released bits (§1.10)"

CHAINS: list[tuple[str, Mechanism, tuple[float, ...], bool, list[Any]]] = [
    ("laplace", Laplace(1.0, dimension=4), (0.5, 1.0, 2.0), False, FLOATS),
    ("laplace, sealed", Laplace(1.0, dimension=4), (0.5, 1.0, 2.0), True, FLOATS),
    (
        "laplace, a fine grid (a chunked geometric)",
        Laplace(1.0, dimension=4),
        (1e-6, 1e-3),
        False,
        FLOATS,
    ),
    ("laplace, a finer grid (two chunks)", Laplace(1.0, dimension=4), (1e-8, 1e-7), False, FLOATS),
    ("discrete_laplace", DiscreteLaplace(2.0), (0.25, 1.0, 4.0), False, [3, -4, 0, 250]),
    ("gaussian", Gaussian(1.0), (0.5, 1.0, 2.0), False, FLOATS),
    ("gaussian, sealed", Gaussian(3.0), (0.5, 1.0, 2.0), True, FLOATS),
    ("poisson", Poisson(1.0), (0.01, 0.1, 1.0), False, [3, 0, 17, 250]),
    (RAPPOR, Laplace(2.0, dimension=8), (2.0, 4.0, 8.0), False, [0, 0, 0, 1, 0, 0, 0, 0]),
]


def _identity_json(parts: tuple[Any, ...]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for p in parts:
        if isinstance(p, bytes):
            out.append(["bytes", p.hex()])
        elif isinstance(p, str):
            out.append(["text", p])
        elif isinstance(p, int):
            out.append(["integer", p])
        else:
            out.append(["double", float(p).hex()])
    return out


def digest(values: np.ndarray[Any, Any]) -> str:
    """The value digest of §1.3: SHA-256 of the little-endian numbers, lowercase hex."""
    return hashlib.sha256(values.astype(values.dtype.newbyteorder("<")).tobytes()).hexdigest()


def _chain(
    name: str, mech: Mechanism, levels: tuple[float, ...], sealed: bool, value: list[Any]
) -> dict[str, Any]:
    chain = ReleaseChain(mech, levels, sealed=sealed)
    keys = NoiseKeys(SECRET)
    exact = mech.validate_value(value)
    ident = ("stream-1", "value-1", digest(exact))
    st = chain.seal(exact, ident, keys) if sealed else chain.open(exact)
    releases = [chain.release([st], k, [ident], keys)[0] for k in range(len(levels))]
    entry: dict[str, Any] = {
        "name": name,
        "family": mech.name,
        "sensitivity": mech.sensitivity.hex(),
        "dimension": len(value),
        "levels": [float(x).hex() for x in chain.levels],
        "sealed": sealed,
        "value": [float(v).hex() for v in exact] if exact.dtype.kind == "f" else exact.tolist(),
        "identity": _identity_json(ident),
        "fingerprint": chain.fingerprint.hex(),
        "step_keys": [chain.key(keys, ident, k).hex() for k in range(len(levels))],
        "integers": [st.steps[k].tolist() for k in range(len(levels))],
        "releases": [
            [float(v).hex() for v in y] if y.dtype.kind == "f" else y.tolist() for y in releases
        ],
    }
    if isinstance(mech, Laplace):
        entry["grid_exponent"] = mech.grid_exponent
        entry["D"] = mech.units()
    if name == RAPPOR:
        entry["bits"] = [released_bits(y).astype(int).tolist() for y in releases]
    if isinstance(mech, Gaussian):
        entry["grid_exponents"] = [mech.grid_exponent(x) for x in chain.levels]
    return entry


def _planted(key: bytes, slots: int, words: dict[int, int]) -> Draws:
    """The draws of ``key`` for one coordinate, with some of its main words replaced: a word
    that straddles a threshold makes the outcome depend on the extension words."""
    draws = Draws(key, 1, slots)
    planted = draws._words.copy()
    for s, w in words.items():
        planted[s, 0] = w
    draws._words = planted
    return draws


def _word_at(x: Decimal) -> int:
    """The 64-bit word whose interval [w, w + 1)·2⁻⁶⁴ holds ``x``."""
    return int(x * Decimal(2**64))


def _straddles() -> list[dict[str, Any]]:
    """Outcomes whose first 64 bits do not decide them (§1.2's extension words at work)."""
    getcontext().prec = 60
    out = []
    a = Fraction(1, 2)
    q = Decimal("-0.5").exp()
    k_l = (1 - q) / (1 + q) * q / (1 - q)  # the fresh law's K_L = c·q/(1 − q)
    law = _dlap.Law(a, None, None)
    cases = [
        ("discrete Laplace part: U₁ at K_L", {0: _word_at(k_l)}),
        (
            "discrete Laplace geometric: U at 1 − e^{−3a}, in the right part",
            {0: 2**64 - 1, 1: _word_at(1 - Decimal("-1.5").exp())},
        ),
    ]
    for i, (name, words) in enumerate(cases):
        key = request_key(SECRET, identity_bytes("straddle", i))
        draws = _planted(key, _dlap.slots(law), words)
        got = np.zeros(1, dtype=np.int64)
        _dlap.sample_into(got, np.zeros(1, dtype=np.int64), None, law, draws)
        out.append(
            {
                "name": name,
                "family": "discrete_laplace",
                "a": "1/2",
                "key": key.hex(),
                "words": {str(s): str(w) for s, w in words.items()},
                "outcome": int(got[0]),
            }
        )
    mu = Fraction(20)
    cdf = sum(Decimal(20) ** j / Decimal(math.factorial(j)) for j in range(21)) * Decimal(-20).exp()
    key = request_key(SECRET, identity_bytes("straddle", 2))
    draws = _planted(key, 1, {0: _word_at(cdf)})
    got_p = _poisson.sample([_poisson.Poisson(mu)], np.zeros(1, dtype=np.intp), draws)
    out.append(
        {
            "name": "Poisson: U at F(20), μ = 20",
            "family": "poisson",
            "mu": "20",
            "key": key.hex(),
            "words": {"0": str(_word_at(cdf))},
            "outcome": int(got_p[0]),
        }
    )
    return out


HISTOGRAM = {
    "levels": (0.25, 4.0),
    "sensitivity": 1.0,
    "domain": 200,
    "false_keys": 20.0,
    "grid": 16,
    "keys": [3, 17, 42, 99, 150, 151],
    "counts": [0.5, 2.0, 5.0, 12.0, -1.0, 3.25],
}


def _hex(values: Any) -> list[str]:
    return [float(x).hex() for x in values]


def _histogram() -> dict[str, Any]:
    """The histogram chain's vector (§1.9): its public law, then the releases of one value."""
    h = HISTOGRAM
    chain = HistogramChain(
        h["levels"],
        sensitivity=h["sensitivity"],
        domain=h["domain"],
        false_keys=h["false_keys"],
        grid=h["grid"],
    )
    value = chain.value(h["keys"], h["counts"])
    ident = ("stream-1", "value-1", value.digest())
    steps = chain.release_steps(value, set(range(len(chain))), ident, NoiseKeys(SECRET))
    law = []
    for r in chain._rounds:
        cells = None
        if r.grid is not None and r.cdf is not None and r.width is not None:
            cells = {"centres": _hex(r.grid), "widths": _hex(r.width), "cdf": _hex(r.cdf)}
        law.append(
            {
                "threshold": r.tau.hex(),
                "a": r.a.hex(),
                "sd": r.sd.hex(),
                "p": r.p.hex(),
                "grid_exponent": r.grid_exp,
                "cells": cells,
            }
        )
    return {
        "sensitivity": float(h["sensitivity"]).hex(),
        "domain": h["domain"],
        "false_keys": float(h["false_keys"]).hex(),
        "grid": h["grid"],
        "cells": chain.cells,
        "levels": _hex(h["levels"]),
        "keys": h["keys"],
        "counts": _hex(h["counts"]),
        "identity": _identity_json(ident),
        "fingerprint": chain.fingerprint.hex(),
        "max_false_keys": chain.max_false_keys,
        "law": law,
        "releases": [
            {"keys": [int(k) for k in keys], "counts": _hex(counts)}
            for _, (keys, counts) in sorted(steps.items())
        ],
        "noise_check_histogram": noise_check_histogram(),
    }


def generate() -> dict[str, Any]:
    """Every vector of §1.8."""
    ident = ("stream", "v1", 3, b"\x00\xff", -0.5)
    key = request_key(SECRET, identity_bytes(*ident))
    draws = Draws(key, 3, 2)
    ext = LazyUniform(int(draws.slot(1)[2]), key, 1, 2)
    ext.refine()
    ext.refine()
    return {
        "secret": SECRET.hex(),
        "request_key": {
            "identity": _identity_json(ident),
            "encoding": identity_bytes(*ident).hex(),
            "key": key.hex(),
        },
        "draws": {
            "key": key.hex(),
            "n": 3,
            "slots": 2,
            "main_words": [str(int(w)) for s in range(2) for w in draws.slot(s)],
            "extension_slot_1_index_2": [str(ext.num >> 64 & MASK), str(ext.num & MASK)],
        },
        "chains": [_chain(*case) for case in CHAINS],
        "straddles": _straddles(),
        "noise_check": noise_check(),
        "histogram": _histogram(),
    }


if __name__ == "__main__":
    print(json.dumps(generate(), indent=1))
