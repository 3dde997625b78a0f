"""The optional compiled noise step (``market._cnoise``); everything else is in pyproject.toml.

``optional=True``: where no C compiler exists the install still succeeds and the market runs
its numpy reference path (``market._step`` says which one it uses). No build dependency beyond
setuptools: the extension includes only Python's headers.
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add (baseline on arm64), so the float passes round each
# operation as market/_cnoise.c says; MSVC does not contract unless asked (/fp:contract).
# -fno-math-errno and -fno-trapping-math change no result (sqrt and floor still round as IEEE
# says; only errno and the inexact flag go unobserved): without them GCC will not vectorise a
# loop that calls sqrt or floor, and the Gaussian float pass is such a loop.
_FLAGS = (
    []
    if sys.platform == "win32"
    else ["-O3", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]
)

setup(
    ext_modules=[
        Extension(
            "market._cnoise",
            ["market/_cnoise.c"],
            extra_compile_args=_FLAGS,
            optional=True,
        )
    ]
)
