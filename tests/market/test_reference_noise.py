"""The independent reference implementation reproduces every vector of ``docs/protocol.md`` §1.

``reference_noise`` is written from the protocol text alone; these tests read the JSON block of
§1.8 and the constant of §1.7 straight from the document, so a change to either the text's
vectors or the reference shows up here.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tests.market import reference_noise as ref

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
F = Fraction


def _document() -> str:
    return PROTOCOL.read_text(encoding="utf-8")


def _vectors() -> dict[str, Any]:
    text = _document()
    block = text.split("<!-- vectors: begin -->", 1)[1].split("<!-- vectors: end -->", 1)[0]
    body = re.search(r"```json\s*(.*?)```", block, re.DOTALL)
    assert body is not None, "no ```json block between the vector markers"
    data: dict[str, Any] = json.loads(body.group(1))
    return data


VECTORS = _vectors()
SECRET = bytes.fromhex(VECTORS["secret"])
CHAINS = VECTORS["chains"]


def _part(kind: str, data: Any) -> ref.Part:
    if kind == "text":
        return str(data)
    if kind == "bytes":
        return bytes.fromhex(data)
    if kind == "integer":
        return int(data)
    if kind == "double":
        return float.fromhex(data)
    raise ValueError(kind)


def _identity(parts: list[list[Any]]) -> list[ref.Part]:
    return [_part(kind, data) for kind, data in parts]


def _value(chain: dict[str, Any]) -> list[float] | list[int]:
    if chain["family"] in ("laplace", "gaussian"):
        return [float.fromhex(x) for x in chain["value"]]
    return [int(x) for x in chain["value"]]


def _spelled(rows: list[list[float]] | list[list[int]]) -> list[list[str | int]]:
    """Doubles by their hex spelling (exact), integers as they are."""
    return [[x.hex() if isinstance(x, float) else x for x in row] for row in rows]


def _run(chain: dict[str, Any], secret: bytes = SECRET, **change: Any) -> ref.ChainResult:
    levels = [float.fromhex(x) for x in chain["levels"]]
    args: dict[str, Any] = {
        "secret": secret,
        "family": chain["family"],
        "sensitivity": float.fromhex(chain["sensitivity"]),
        "dimension": chain["dimension"],
        "levels": levels,
        "sealed": chain["sealed"],
        "value": _value(chain),
        "identity": _identity(chain["identity"]),
    }
    args.update(change)
    return ref.run_chain(**args)


_RESULTS: dict[str, ref.ChainResult] = {}


def _result(chain: dict[str, Any]) -> ref.ChainResult:
    if chain["name"] not in _RESULTS:
        _RESULTS[chain["name"]] = _run(chain)
    return _RESULTS[chain["name"]]


# --- §1.1, §1.2 ------------------------------------------------------------------------------


def test_identity_encoding_and_request_key() -> None:
    vec = VECTORS["request_key"]
    identity = _identity(vec["identity"])
    assert ref.enc(identity).hex() == vec["encoding"]
    assert ref.request_key(SECRET, identity).hex() == vec["key"]


def test_main_and_extension_words() -> None:
    vec = VECTORS["draws"]
    key = bytes.fromhex(vec["key"])
    assert key.hex() == VECTORS["request_key"]["key"]
    n, slots = vec["n"], vec["slots"]
    draws = ref.Draws(key, n)
    words = [str(draws.main_word(t)) for t in range(n * slots)]
    assert words == vec["main_words"]
    # slot s of coordinate i begins with w_{s·n+i}
    for s in range(slots):
        for i in range(n):
            assert str(draws.uniform(s, i).bits) == vec["main_words"][s * n + i]
    ext = vec["extension_slot_1_index_2"]
    assert [str(w) for w in ref.extension_words(key, 1, 2, len(ext))] == ext
    # the same words extend the ideal uniform of slot 1, coordinate 2, most significant first
    u = draws.uniform(1, 2)
    u.ensure(1 + len(ext))
    expected = int(vec["main_words"][1 * n + 2])
    for w in ext:
        expected = (expected << 64) | int(w)
    assert u.bits == expected
    assert u.interval == (F(expected, 2 ** (64 * 3)), F(expected + 1, 2 ** (64 * 3)))


# --- §1.3 – §1.6: every chain ----------------------------------------------------------------


@pytest.mark.parametrize("chain", CHAINS, ids=[c["name"] for c in CHAINS])
def test_chain_identity_fingerprint_and_step_keys(chain: dict[str, Any]) -> None:
    family = chain["family"]
    identity = _identity(chain["identity"])
    assert identity[:2] == ["stream-1", "value-1"]
    assert identity[2] == ref.value_digest(family, _value(chain))
    levels = [float.fromhex(x) for x in chain["levels"]]
    fp = ref.fingerprint(
        family, chain["sealed"], float.fromhex(chain["sensitivity"]), chain["dimension"], levels
    )
    assert fp.hex() == chain["fingerprint"]
    keys = [ref.step_key(SECRET, fp, identity, j).hex() for j in range(len(levels))]
    assert keys == chain["step_keys"]


@pytest.mark.parametrize("chain", CHAINS, ids=[c["name"] for c in CHAINS])
def test_chain_integers_and_releases(chain: dict[str, Any]) -> None:
    result = _result(chain)
    assert result.fingerprint.hex() == chain["fingerprint"]
    assert [k.hex() for k in result.step_keys] == chain["step_keys"]
    assert result.integers == chain["integers"]
    if chain["family"] in ("laplace", "gaussian"):
        assert _spelled(result.releases) == chain["releases"]
    else:
        assert result.releases == chain["releases"]
    if "grid_exponent" in chain:
        assert result.grid_exponents == [chain["grid_exponent"]] * len(chain["levels"])
        assert result.lattice_sensitivity == chain["D"]
    if "grid_exponents" in chain:
        assert result.grid_exponents == chain["grid_exponents"]
    # a release is the double nearest n·2^k (exact here: every n is far below 2^53)
    for row, ints, k in zip(result.releases, result.integers, result.grid_exponents, strict=True):
        for x, n in zip(row, ints, strict=True):
            assert F(x) == n * F(2) ** k


@pytest.mark.parametrize("chain", [c for c in CHAINS if "bits" in c], ids=lambda c: c["name"])
def test_rappor_bits_are_the_lattice_points_above_half(chain: dict[str, Any]) -> None:
    """§1.10: a released bit is ``[n > 2^(−k−1)]``, ``n`` the reference's own lattice integer:
    an integer comparison, with no logarithm and no rounding in the decision."""
    result = _result(chain)
    assert chain["bits"] and all(set(row) <= {0, 1} for row in chain["bits"])
    half = [F(1, 2) / F(2) ** k for k in result.grid_exponents]
    bits = [[int(n > h) for n in row] for row, h in zip(result.integers, half, strict=True)]
    assert bits == chain["bits"]


def test_the_vectors_cover_every_family_and_both_geometric_plans() -> None:
    families = {c["family"] for c in CHAINS}
    assert families == set(ref.FAMILY_CODES)
    plans = set()
    for chain in CHAINS:
        if chain["family"] == "laplace":
            for level in chain["levels"]:
                a = F(float.fromhex(level)) / chain["D"]
                plans.add(len(ref.geometric_plan(a).widths))
    assert plans == {0, 1, 2}  # plain, one chunk and two


@pytest.mark.parametrize("case", VECTORS["straddles"], ids=lambda c: c["name"])
def test_the_straddling_draws_read_the_extension_words(case: dict[str, Any]) -> None:
    """§1.8 ``straddles``: main words replaced by ones the first 64 bits cannot decide; the
    outcome is the one the key's extension words decide."""
    key = bytes.fromhex(case["key"])
    draws = ref.Draws(key, 1)
    planted = []
    for slot, word in case["words"].items():
        u = draws.uniform(int(slot), 0)
        u.bits = int(word)  # replace the main word (nothing read beyond it yet)
        planted.append(u)
    if case["family"] == "poisson":
        got = ref.draw_poisson(draws, 0, F(case["mu"]))
    else:
        got = ref.draw_lattice_laplace(draws, 0, F(case["a"]), None)
    assert got == case["outcome"]
    assert any(u.count >= 2 for u in planted)  # an extension word was needed


# --- §1.7 ------------------------------------------------------------------------------------


def _published_check() -> str:
    found = re.findall(r"noise_check = ([0-9a-f]{64})", _document())
    assert len(found) == 1
    return str(found[0])


def test_noise_check_matches_the_text_and_the_vectors() -> None:
    assert _published_check() == VECTORS["noise_check"]
    assert ref.noise_check() == VECTORS["noise_check"]


def test_noise_check_hashes_each_family_open_then_sealed() -> None:
    """§1.7's "of open then sealed chains" must be read row by row of its table."""
    assert ref.noise_check("per-family") == _published_check()
    assert ref.noise_check("open-then-sealed") != _published_check()


# --- the reference can fail ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["laplace", "discrete_laplace", "gaussian", "poisson", "laplace, sealed"]
)
def test_a_wrong_secret_or_level_changes_the_outputs(name: str) -> None:
    chain = next(c for c in CHAINS if c["name"] == name)
    good = _result(chain)
    wrong_secret = _run(chain, secret=bytes(reversed(SECRET)))
    assert wrong_secret.fingerprint == good.fingerprint
    assert wrong_secret.step_keys != good.step_keys
    assert wrong_secret.integers != good.integers
    levels = [float.fromhex(x) for x in chain["levels"]]
    levels[-1] = levels[-1] * 1.5
    wrong_level = _run(chain, levels=levels)
    assert wrong_level.fingerprint != good.fingerprint
    assert wrong_level.integers != good.integers
    assert _spelled(wrong_level.releases) != chain["releases"]


def test_a_changed_identity_part_changes_the_key() -> None:
    vec = VECTORS["request_key"]
    identity = _identity(vec["identity"])
    assert ref.request_key(SECRET, [*identity[:-1], -0.25]).hex() != vec["key"]
    assert ref.request_key(SECRET, [*identity[:2], "3", *identity[3:]]).hex() != vec["key"]


# --- the exact machinery ---------------------------------------------------------------------


@pytest.mark.parametrize("p", [64, 200])
def test_enclosures_contain_the_value_and_are_tight(p: int) -> None:
    def check(enclosure: ref.Interval, value: float) -> None:
        lo, hi = enclosure
        assert lo <= hi
        assert hi - lo <= abs(F(value)) * F(1, 2 ** (p - 4)) + F(1, 2 ** (p - 4))
        slack = F(math.ulp(value)) * 2
        assert lo - slack <= F(value) <= hi + slack

    for x in [F(1, 3), F(-7, 2), F(40), F(-90), F(1, 10**12), F(-(2**-40))]:
        check(ref.exp_iv(x, p), math.exp(x))
    for y in [F(1, 3), F(7, 2), F(10**9), F(1, 10**12), F(3, 4), F(3, 2), F(1, 2**64)]:
        check(ref.log_iv(y, p), math.log(y))
    check(ref.pi_iv(p), math.pi)
    check(ref.ln2_iv(p), math.log(2))
    for u in [F(0), F(1, 8), F(1, 4), F(3, 10), F(1, 2), F(5, 7), F(3, 4), F(99, 100)]:
        lo, hi = ref.cos_2pi_iv(u, p)
        assert lo <= hi
        assert hi - lo <= F(1, 2 ** (p - 8))
        assert lo - F(1, 2**50) <= F(math.cos(2 * math.pi * u)) <= hi + F(1, 2**50)
    lo, hi = ref.sqrt_iv((F(2), F(2)), p)
    assert lo * lo <= 2 <= hi * hi
    assert hi - lo <= F(1, 2 ** (p - 4))


def test_a_decision_at_a_word_boundary_reads_the_extension_stream() -> None:
    """When 64 bits cannot decide, the outcome is that of the longer expansion."""
    key = bytes(range(32))
    s = F(1)  # G = 0 iff U < 1 − e^{−1}
    lo, hi = ref.exp_iv(-s, 400)
    threshold = (1 - hi, 1 - lo)
    word = math.floor(threshold[0] * 2**64)
    assert word == math.floor(threshold[1] * 2**64)  # U's first word straddles the threshold
    u = ref.Uniform(word, ref._Stream(key, ref.extension_nonce(1, 0)))
    g = ref._geometric_floor(u, s)
    assert u.count >= 2
    ext = ref.extension_words(key, 1, 0, 1)[0]
    prefix = (word << 64) | ext
    u_lo, u_hi = F(prefix, 2**128), F(prefix + 1, 2**128)
    assert u_hi <= threshold[0] or u_lo >= threshold[1]  # 128 bits decide
    assert g == (0 if u_hi <= threshold[0] else 1)

    # the same at the Laplace part boundary U₁ = K_L (fresh, a = 1/2)
    a = F(1, 2)
    k_lo, k_hi = ref._side_weight(a, None, 400)
    word = math.floor(k_lo * 2**64)
    assert word == math.floor(k_hi * 2**64)
    draws = ref.Draws(key, 1)
    u1 = draws.uniform(0, 0)
    u1.bits = word  # plant the boundary word in slot 0 of coordinate 0
    j = ref.draw_lattice_laplace(draws, 0, a, None)
    assert u1.count >= 2
    prefix = (word << 64) | ref.extension_words(key, 0, 0, 1)[0]
    below = F(prefix + 1, 2**128) <= k_lo
    assert below or F(prefix, 2**128) >= k_hi
    assert (j < 0) == below
    assert j != 0


def test_geometric_plans_follow_the_text() -> None:
    assert ref.geometric_plan(F(1, 2**20)).widths == ()
    plan = ref.geometric_plan(F(1, 2**20) - F(1, 2**80))
    assert (plan.M, plan.widths, plan.starts, plan.slots) == (1, (1,), (0,), 2)
    plan = ref.geometric_plan(F(1, 2**50))
    assert (plan.M, plan.widths, plan.starts) == (30, (15, 15), (0, 15))
    plan = ref.geometric_plan(F(1, 2**61))
    assert (plan.M, plan.widths, plan.starts) == (41, (14, 14, 13), (0, 14, 28))
    plan = ref.geometric_plan(F(3, 2**62))  # s·2^M >= 2^-20 first at M = 41
    assert (plan.M, plan.widths) == (41, (14, 14, 13))


def test_lattice_and_gaussian_grids() -> None:
    assert ref.lattice_grid("laplace", 1.0, 4) == (-14, 16388)
    assert ref.lattice_grid("laplace", 1.0, 16) == (-16, 65552)
    assert ref.lattice_grid("laplace", 3.0, 1) == (-11, 3 * 2**11 + 1)
    assert ref.lattice_grid("discrete_laplace", 2.0, 4) == (0, 2)
    with pytest.raises(ValueError, match="integer"):
        ref.lattice_grid("discrete_laplace", 1.5, 4)
    assert ref.encode_lattice(2.5 * 2**-14, -14) == 2  # ties to even
    assert ref.encode_lattice(3.5 * 2**-14, -14) == 4
    assert ref.encode_lattice(-2.5 * 2**-14, -14) == -2
    # k = ⌊⌊log₂ v⌋/2⌋ − 16: the grid is in (2^-17 σ, 2^-16 σ]
    for v in [F(1), F(1, 2), F(1, 4), F(9), F(9, 2), F(9, 4), F(10**6, 3), F(1, 10**5)]:
        k = ref.gaussian_grid(v)
        assert F(2) ** (2 * k) * 2**32 <= v < F(2) ** (2 * k) * 2**34


def test_the_histogram_releases_follow_from_the_law_and_the_text() -> None:
    """§1.9: the independent implementation, given the chain's public law, releases the
    vector's keys and counts at every step, and the fingerprint it computes is the vector's."""
    vector = VECTORS["histogram"]
    levels = [float.fromhex(x) for x in vector["levels"]]
    fp = ref.histogram_fingerprint(
        float.fromhex(vector["sensitivity"]),
        vector["domain"],
        float.fromhex(vector["false_keys"]),
        vector["grid"],
        levels,
        vector["cells"],
    )
    assert fp.hex() == vector["fingerprint"]
    got = ref.run_histogram(SECRET, vector)
    want = [(r["keys"], [float.fromhex(c) for c in r["counts"]]) for r in vector["releases"]]
    assert got == want
    assert any(k not in vector["keys"] for keys, _ in got for k in keys)  # zero counts shown
    other = ref.run_histogram(bytes(32), vector)
    assert other != got
