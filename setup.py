"""The optional compiled noise step (``market._cnoise``); everything else is in pyproject.toml.

``optional=True``: where no C compiler exists the install still succeeds and the market runs
its numpy reference path (``market._step`` says which one it uses). No build dependency beyond
setuptools: the extension includes only Python's headers.
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add (baseline on arm64), so the float passes round each
# operation as market/_cnoise.c says; MSVC does not contract unless asked (/fp:contract).
_FLAGS = [] if sys.platform == "win32" else ["-O3", "-std=c11", "-ffp-contract=off"]

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
