"""The tree as docs/architecture.md draws it: each program loads only what it runs, and no package holds
more than a seventh of the product (the import contracts themselves: pyproject.toml, `lint-imports`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "src" / "netclaim"
NODE_ONLY = ("pyroute2", "grpclib", "netclaim.adapters.netlink", "netclaim.adapters.nri", "netclaim.agent")
# Prints, as the interpreter exits, which node-only modules the command had loaded.
PROBE = """
import atexit, json, sys
node_only = {node_only}
atexit.register(lambda: print(json.dumps(sorted(
    m for m in sys.modules if any(m == n or m.startswith(n + ".") for n in node_only)
)), file=sys.__stderr__))
{start}
"""


def _loaded(start: str) -> tuple[list[str], str]:
    """Run a program's entry point in a fresh interpreter: the node-only modules it had loaded, and what
    it said."""
    probe = PROBE.format(node_only=repr(NODE_ONLY), start=start)
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    *said, loaded = done.stderr.strip().splitlines()
    return list(json.loads(loaded)), "\n".join(said)


@pytest.mark.parametrize(
    ("program", "start"),
    [
        # both read the API only, and stop at the kubeconfig that is not there: after their imports
        (
            "netclaim controller",
            "from netclaim.cli.main import main; main(['controller', '--kubeconfig', '/none'])",
        ),
        (
            "kubectl netclaim explain",
            "from netclaim.cli.main import kubectl_main; kubectl_main(['explain', '--kubeconfig', '/none'])",
        ),
    ],
)
def test_the_controller_and_explain_never_load_the_nodes_code(program: str, start: str) -> None:
    loaded, said = _loaded(start)
    assert "--kubeconfig /none: Configuration file /none not found" in said  # it ran as far as its API
    assert loaded == []


def test_the_agent_loads_the_nodes_code() -> None:
    """The probe sees what it is asked about: the agent's own imports bring netlink and NRI."""
    loaded, _ = _loaded("import netclaim.agent.main")
    assert {"pyroute2", "netclaim.adapters.netlink", "netclaim.adapters.nri"} <= set(loaded)


def test_no_package_holds_more_than_a_seventh_of_the_product() -> None:
    lines: dict[str, int] = {}
    for module in SOURCE.rglob("*.py"):
        package = str(module.parent.relative_to(SOURCE.parent))
        lines[package] = lines.get(package, 0) + len(module.read_text().splitlines())
    total = sum(lines.values())
    assert total > 10_000 and len(lines) > 10  # the whole product was counted
    assert {p: round(n / total, 3) for p, n in lines.items() if n / total > 0.15} == {}
