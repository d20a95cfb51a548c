"""deploy/ is the chart rendered with its default values: one source for both install paths.

`make deploy` writes it (`python -m netclaim_lab.manifests`); tests/test_helm_chart.py fails when the
checked-in files differ from a fresh rendering. Each template becomes the file of the same name (the
namespace first, so that `kubectl apply -f deploy/` creates it before what lives in it), its documents in
the order helm installs them, with a header saying where they come from. The MultiNetworkPolicy CRD goes
into a directory of its own, which neither `kubectl apply -f deploy/` nor `kubectl delete -f deploy/`
reaches: it is created only where no other project has, and never deleted with netclaim.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from netclaim_lab.binaries import built_bin_dir
from netclaim_lab.layout import REPO_ROOT

CHART = REPO_ROOT / "charts" / "netclaim"
DEPLOY = REPO_ROOT / "deploy"
RELEASE = "netclaim"
NAMESPACE = "netclaim-system"
SOURCE = f"# Source: {RELEASE}/templates/"
FILE_NAMES = {
    "namespace.yaml": "00-namespace.yaml",  # applied first by `kubectl apply -f deploy/`
    "multinetworkpolicy-crd.yaml": "multinetworkpolicy/crd.yaml",
}
HEADER = (
    "# Rendered from charts/netclaim with its default values by `make deploy`: edit the chart, then run it.\n"
)


def render(helm: Path, values: Mapping[str, str] | None = None) -> dict[str, str]:
    """deploy/'s file name -> its text, from `helm template` of the chart with its default values, or with
    `values` set as `helm install --set` sets them."""
    settings = [arg for key, value in (values or {}).items() for arg in ("--set", f"{key}={value}")]
    output = subprocess.run(
        [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *settings],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    files: dict[str, list[str]] = {}
    for document in output.split("\n---\n"):
        first, _, body = document.removeprefix("---\n").partition("\n")
        if not first.startswith(SOURCE):
            raise ValueError(f"helm template: a document without its source: {first!r}")
        template = first.removeprefix(SOURCE)
        files.setdefault(FILE_NAMES.get(template, template), []).append(body.strip("\n") + "\n")
    return {name: HEADER + "---\n".join(documents) for name, documents in files.items()}


def on_disk() -> dict[str, str]:
    """deploy/'s files as they are, by their path inside it."""
    return {str(p.relative_to(DEPLOY)): p.read_text() for p in sorted(DEPLOY.rglob("*.yaml"))}


def main() -> int:
    rendered = render(built_bin_dir() / "helm")
    for stale in set(on_disk()) - set(rendered):
        (DEPLOY / stale).unlink()
    for name, text in rendered.items():
        (DEPLOY / name).parent.mkdir(exist_ok=True)
        (DEPLOY / name).write_text(text)
    print(f"deploy/: {len(rendered)} files rendered from charts/netclaim")
    return 0


if __name__ == "__main__":
    sys.exit(main())
