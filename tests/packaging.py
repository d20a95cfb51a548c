"""What the product's wheel and image must not hold: the lab's code and what only the lab installs."""

from __future__ import annotations

import re
from collections.abc import Iterable

# lab/pyproject.toml's own: module, distribution or program names (`-` read as `_`).
LAB_ONLY = frozenset({"netclaim_lab", "cryptography", "matplotlib", "py_spy"})


def lab_paths(paths: Iterable[str]) -> list[str]:
    """The paths (of a wheel, of an image) that are the lab's: netclaim_lab, the old netclaim/cluster, or a
    package only the lab installs (`cryptography/`, `cryptography-50.0.2.dist-info/`, `bin/py-spy`)."""
    found = []
    for path in paths:
        names = {re.split(r"-\d", part)[0].replace("-", "_") for part in path.split("/")}
        if names & LAB_ONLY or re.search(r"(^|/)netclaim/cluster(/|$)", path):
            found.append(path)
    return found
