"""Print deploy/constraints.txt: the exact versions the worker image installs.

    .venv/bin/python deploy/make-constraints.py > deploy/constraints.txt

The runtime dependencies are the project's own and its ``service`` extra, with everything they
pull in (markers evaluated here), each at the version installed in the running environment
(``pip freeze --exclude-editable``); test, lint and report tools are left out. Run it after
changing a dependency in pyproject.toml, in a venv that passed ``make test``;
tests/test_deploy.py checks that every runtime dependency is pinned, within pyproject's range.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def runtime_closure(pyproject: Path) -> set[str]:
    """Canonical names of the runtime dependencies and of all they require, transitively."""
    project = tomllib.loads(pyproject.read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    todo += [Requirement(r) for r in project["optional-dependencies"]["service"]]
    extras: dict[str, set[str]] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in extras and set(req.extras) <= extras[name]:
            continue
        extras.setdefault(name, set()).update(req.extras)
        for spec in distribution(name).requires or []:
            dep = Requirement(spec)
            wanted = extras[name] or {""}
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(dep)
    return set(extras)


def main() -> None:
    root = Path(__file__).resolve().parents[1]
    names = runtime_closure(root / "pyproject.toml")
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    print("# The worker image's runtime dependencies, pinned: deploy/Dockerfile installs with")
    print("# `pip install -c deploy/constraints.txt`. Made by deploy/make-constraints.py; do not")
    print("# edit by hand.")
    for line in frozen:
        if "==" in line and canonicalize_name(line.split("==")[0]) in names:
            print(line)


if __name__ == "__main__":
    main()
