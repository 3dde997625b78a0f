"""Noise format v2 is the document's: its vectors are what the code computes, on every machine.

* the JSON block of ``docs/protocol.md`` §1.8 equals what this implementation computes now
  (``tests/market/protocol_vectors.py``), and §1.7's ``noise_check`` is the same constant;
* the same bytes come out under every SIMD path numpy offers on this machine
  (``NPY_DISABLE_CPU_FEATURES``), with every transcendental function the samplers call moved by
  one unit in the last place either way, and under the oldest numpy ``pyproject.toml`` allows.

An independent implementation written from the document alone reproduces the same vectors in
exact arithmetic (``tests/market/test_reference_noise.py``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path
from typing import Any

import pytest

from .protocol_vectors import generate

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"


def documented() -> dict[str, Any]:
    """The vectors block of docs/protocol.md."""
    text = DOC.read_text()
    block = re.search(
        r"<!-- vectors: begin -->\s*```json\n(.*?)\n```\s*<!-- vectors: end -->", text, re.S
    )
    assert block is not None, "docs/protocol.md lost its vectors block"
    out: dict[str, Any] = json.loads(block.group(1))
    return out


def test_the_document_vectors_are_what_the_code_computes() -> None:
    doc, ours = documented(), generate()
    for name in ("request_key", "draws", "noise_check", "secret", "histogram"):
        assert ours[name] == doc[name], name
    assert [c["name"] for c in ours["chains"]] == [c["name"] for c in doc["chains"]]
    for mine, theirs in zip(ours["chains"], doc["chains"], strict=True):
        assert mine == theirs, mine["name"]
    stated = re.search(r"noise_check = ([0-9a-f]{64})", DOC.read_text())
    assert stated is not None and stated.group(1) == doc["noise_check"]


def test_a_changed_secret_or_level_changes_the_vectors() -> None:
    """The comparison above has power: the vectors depend on what they claim to."""
    from market import Laplace
    from market.chain import ReleaseChain
    from market.rng import NoiseKeys

    doc = documented()["chains"][0]
    x = [20.1, 19.8, 21.0, 20.4]
    ident = tuple(p[1] for p in doc["identity"])
    for secret, levels in ((bytes(32), (0.5, 1.0, 2.0)), (bytes(range(32)), (0.5, 1.0, 2.5))):
        chain = ReleaseChain(Laplace(1.0, dimension=4), levels)
        st = chain.open(x)
        ints = chain.release([st], 0, [ident], NoiseKeys(secret))
        assert st.steps[0].tolist() != doc["integers"][0], ints


_RUN = (
    "import json; from tests.market.protocol_vectors import generate; print(json.dumps(generate()))"
)

_PERTURB = """
import math, sys
import numpy as np
direction = float(sys.argv[1])
gross = len(sys.argv) > 2
for name in ("log", "log1p", "expm1", "exp", "cos", "sin", "tanh"):
    orig = getattr(np, name)
    def wrapped(*a, _orig=orig, **k):
        r = _orig(*a, **k)
        out = k.get("out")
        nudged = r * (1 + 1e-3) if gross else np.nextafter(r, direction)
        if out is not None:
            target = out[0] if isinstance(out, tuple) else out
            target[...] = nudged
            return target
        return nudged
    setattr(np, name, wrapped)
for name in ("log", "log1p", "expm1", "exp", "cos", "tanh", "lgamma"):
    orig = getattr(math, name)
    setattr(math, name, lambda *a, _orig=orig: math.nextafter(_orig(*a), direction))
"""


_RUN_HISTOGRAM = (
    "import json; from market.histogram_chain import noise_check_histogram; "
    "print(json.dumps(noise_check_histogram()))"
)


def _vectors_in(
    env: dict[str, str],
    *,
    python: str = sys.executable,
    prelude: str = "",
    args: tuple[str, ...] = (),
    run: str = _RUN,
) -> Any:
    """The vectors computed by a fresh interpreter with this environment."""
    out = subprocess.run(
        [python, "-c", prelude + run, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _simd_settings() -> list[str]:
    """``NPY_DISABLE_CPU_FEATURES`` values from 'none' to 'every dispatch target this machine
    has' (numpy falls back to its baseline), top targets first."""
    from numpy._core import _multiarray_umath as umath

    have = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]
    return [" ".join(reversed(have[len(have) - i :])) for i in range(len(have) + 1)]


@pytest.mark.slow
@pytest.mark.parametrize("disabled", _simd_settings())
def test_every_simd_path_draws_the_documented_noise(disabled: str) -> None:
    assert _vectors_in({"NPY_DISABLE_CPU_FEATURES": disabled}) == documented()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("disabled", "direction"), [(s, d) for s in _simd_settings()[1:] for d in ("", "inf")]
)
def test_histogram_chains_draw_the_same_noise_on_every_simd_path_and_libm(
    disabled: str, direction: str
) -> None:
    """The histogram chains' digest (``docs/protocol.md`` §1.9), recorded by every market, under
    the other SIMD paths, and with numpy's and math's transcendentals one ulp up or down
    (``tests/market/test_histogram_portable.py`` moves scipy's too, on a large histogram)."""
    from market.histogram_chain import noise_check_histogram

    prelude, args = (_PERTURB, (direction,)) if direction else ("", ())
    got = _vectors_in(
        {"NPY_DISABLE_CPU_FEATURES": disabled}, prelude=prelude, args=args, run=_RUN_HISTOGRAM
    )
    assert got == noise_check_histogram()


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["inf", "-inf"])
def test_transcendentals_off_by_an_ulp_draw_the_documented_noise(direction: str) -> None:
    """Every log, log1p, expm1, exp, cos, tanh the samplers call (numpy and math) returns the
    next double up (down): a platform whose libm differs by an ulp. The released bytes must
    not move: the float passes decide only when clear of such errors by a margin."""
    got = _vectors_in({}, prelude=_PERTURB, args=(direction,))
    assert got == documented()


@pytest.mark.slow
def test_a_transcendental_off_by_far_more_than_its_margin_is_seen() -> None:
    """The comparison has power: numpy's functions off by 0.1 % change released bytes."""
    got = _vectors_in({}, prelude=_PERTURB, args=("inf", "gross"))
    assert got["chains"] != documented()["chains"]


def _oldest_numpy() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(d for d in deps if d.replace(" ", "").startswith("numpy>="))
    return floor.replace(" ", "").split(">=")[1].split(",")[0]


@pytest.mark.slow
def test_the_oldest_supported_numpy_draws_the_documented_noise(tmp_path: Path) -> None:
    """In a fresh virtual environment with the oldest numpy pyproject.toml accepts (and the
    other dependencies of the noise engine)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    pins = [f"numpy=={_oldest_numpy()}.*", "cryptography", "randomgen==2.5.1"]
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins]
    install = subprocess.run(pip, capture_output=True, text=True, timeout=600, check=False)
    if install.returncode != 0:
        pytest.skip(f"could not install {pins} from the package index: {install.stderr[-300:]}")
    version = subprocess.run(
        [python, "-c", "import numpy; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version.startswith(_oldest_numpy())
    assert _vectors_in({"PYTHONPATH": str(ROOT)}, python=python) == documented()
