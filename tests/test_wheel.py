"""The product's wheel, built as `make image` builds it, holds the product only: no lab code, nothing only the
lab needs; installed alone into a fresh venv, it brings no lab module. The build takes its pinned backend
from the package index, as `make deps` does (about 3 s)."""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from netclaim_lab import agent_image
from tests.packaging import LAB_ONLY, lab_paths

PRODUCT_COMMANDS = {"netclaim", "kubectl-netclaim"}
PRODUCT_FILES = {
    "netclaim/agent/main.py",
    "netclaim/controller/main.py",
    "netclaim/cli/main.py",
    "netclaim/py.typed",
}


def test_lab_paths_knows_the_labs_files() -> None:
    assert lab_paths(
        [
            "netclaim/agent/main.py",
            "netclaim/cli/main.py",
            "netclaim/clusters.py",
            "netclaim-0.1.0.dist-info/METADATA",
            "usr/lib/python3/dist-packages/cffi/api.py",
            "netclaim_lab/cli.py",
            "netclaim/cluster/pki.py",
            "usr/local/lib/python3.11/dist-packages/netclaim/cluster",
            "usr/local/lib/python3.11/dist-packages/cryptography/x509/base.py",
            "cryptography-50.0.2.dist-info/RECORD",
            "matplotlib/pyplot.py",
            "bin/py-spy",
        ]
    ) == [
        "netclaim_lab/cli.py",
        "netclaim/cluster/pki.py",
        "usr/local/lib/python3.11/dist-packages/netclaim/cluster",
        "usr/local/lib/python3.11/dist-packages/cryptography/x509/base.py",
        "cryptography-50.0.2.dist-info/RECORD",
        "matplotlib/pyplot.py",
        "bin/py-spy",
    ]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_image.build_wheel(tmp_path_factory.mktemp("wheel"))


def _dist_info(archive: zipfile.ZipFile, name: str) -> str:
    (info,) = {n.split("/")[0] for n in archive.namelist() if n.split("/")[0].endswith(".dist-info")}
    return archive.read(f"{info}/{name}").decode()


def test_the_wheel_holds_the_product_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert {n.split("/")[0] for n in names} == {"netclaim", "netclaim-0.1.0.dist-info"}
    assert set(names) >= PRODUCT_FILES
    assert not lab_paths(names)


def test_the_wheel_requires_nothing_only_the_lab_needs(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata = Parser().parsestr(_dist_info(archive, "METADATA"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(_dist_info(archive, "entry_points.txt"))
    required = {
        re.split(r"[^A-Za-z0-9._-]", requirement, maxsplit=1)[0].replace("-", "_").lower()
        for requirement in metadata.get_all("Requires-Dist") or []
    }
    assert "lightkube" in required
    assert not required & LAB_ONLY, required & LAB_ONLY  # the dev extra's too
    assert set(entry_points["console_scripts"]) == PRODUCT_COMMANDS
    locked = {name.replace("-", "_") for name in agent_image.locked_versions()}
    assert not locked & LAB_ONLY  # the image's Python packages


def test_installed_alone_the_product_brings_no_lab_module(wheel: Path, tmp_path: Path) -> None:
    environment = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(environment)], check=True)
    bin_dir = environment / "bin"
    python = bin_dir / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-input"]
    subprocess.run([*pip, "--no-deps", "--no-index", str(wheel)], check=True)
    modules = [
        "netclaim.agent.main",
        "netclaim.controller.main",
        "netclaim.cli.main",
        "netclaim.cluster",
        *sorted(LAB_ONLY),
    ]
    probe = (
        "import importlib.util, json, sys\n"
        "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))"
    )
    # -I: neither PYTHONPATH nor the working directory (this checkout) reaches the fresh interpreter
    found = subprocess.run([python, "-I", "-c", probe, *modules], capture_output=True, text=True, check=True)
    assert json.loads(found.stdout) == [
        "netclaim.agent.main",
        "netclaim.controller.main",
        "netclaim.cli.main",
    ]
    assert (bin_dir / "netclaim").is_file() and (bin_dir / "kubectl-netclaim").is_file()
    assert not (bin_dir / "netclaim-lab").exists()
