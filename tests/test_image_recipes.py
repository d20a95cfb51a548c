"""The image by its other recipes (`make test-recipes`, not `make test`: minutes each, and buildah and
qemu-user besides the lab's tools):

- the repository's Containerfile, built by buildah as a user builds it (netclaim_lab.containerfile), holds
  `make image`'s product (the same Python distributions, every Debian package of image/debian-packages.txt
  and of `make image`'s, the same command) and runs the demo on the lab's cluster;
- the arm64 image, built here from Debian's arm64 packages and the lock's aarch64 wheels (its maintainer
  scripts, byte-compiling and import check ran under qemu-user): every ELF file in it is an AArch64 one,
  and it holds the amd64 image's packages and Python distributions."""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netclaim_lab import agent_image, agents, cli, cluster, containerfile
from netclaim_lab.layout import REPO_ROOT
from netclaim_lab.spec import load_cluster_spec

pytestmark = pytest.mark.recipes

SITE = agent_image.SITE_PACKAGES + "/"
EM_X86_64, EM_AARCH64 = 62, 183
DEMO_CLUSTER = REPO_ROOT / "examples" / "demo" / "cluster.yaml"


def _blob(archive: tarfile.TarFile, digest: str) -> tarfile.TarFile:
    member = archive.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    assert member is not None, digest
    return tarfile.open(fileobj=member, mode="r:*")  # ours are plain tar, buildah's gzip


def _json(archive: tarfile.TarFile, name: str) -> Any:
    member = archive.extractfile(name)
    assert member is not None, name
    return json.load(member)


def _manifest(archive: tarfile.TarFile) -> tuple[dict[str, Any], dict[str, Any]]:
    entry = _json(archive, "index.json")["manifests"][0]
    manifest = _json(archive, f"blobs/sha256/{entry['digest'][7:]}")
    return manifest, _json(archive, f"blobs/sha256/{manifest['config']['digest'][7:]}")


def _files(path: Path) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    """Every member of every layer, bottom up (with the layer, to read a member's bytes)."""
    with tarfile.open(path) as archive:
        manifest, _ = _manifest(archive)
        for layer in manifest["layers"]:
            with _blob(archive, layer["digest"]) as files:
                for member in files:
                    yield member, files


class Image:
    """What a test compares of an image archive: its config, file names, Debian packages, Python
    distributions and each ELF file's machine."""

    def __init__(self, path: Path) -> None:
        with tarfile.open(path) as archive:
            _, self.config = _manifest(archive)
        self.names: set[str] = set()
        self.elf_machines: dict[str, int] = {}
        status = ""
        for member, layer in _files(path):
            name = member.name.removeprefix("./").rstrip("/")
            self.names.add(name)
            if not member.isreg():
                continue
            content = layer.extractfile(member)
            assert content is not None
            if name == "var/lib/dpkg/status":
                status = content.read().decode()
                continue
            head = content.read(20)
            if head[:4] == b"\x7fELF":
                self.elf_machines[name] = int.from_bytes(head[18:20], "little")
        self.debian = {
            block.group(1)
            for block in re.finditer(r"^Package: (\S+)\n(?:.+\n)*?Status: install ok installed", status, re.M)
        }
        self.python = {
            n.removeprefix(SITE).removesuffix(".dist-info")
            for n in self.names
            if n.startswith(SITE) and n.endswith(".dist-info")
        }


def test_the_containerfile_builds_make_images_product_and_it_runs_the_demo() -> None:
    built = containerfile.build()
    made = agent_image.ensure()
    theirs, ours = Image(built.path), Image(made.path)
    assert len(ours.python) > 20 and theirs.python == ours.python
    assert "netclaim-0.1.0" in theirs.python
    assert set(agent_image.debian_packages()) <= theirs.debian
    # make image's merged /usr comes with the package that records it (mmdebstrap's merged-usr hook);
    # Debian's base images have the same layout without it
    assert ours.debian - theirs.debian == {"usr-is-merged"}
    for key in ("Entrypoint", "Cmd"):
        assert theirs.config["config"][key] == ours.config["config"][key]
    assert agent_image.COMMAND_PATH.lstrip("/") in theirs.names

    name = load_cluster_spec(DEMO_CLUSTER).name
    try:
        assert cli.main(["demo", "-f", str(DEMO_CLUSTER), "--image", str(built.path)]) == 0
        handle = cluster.up(DEMO_CLUSTER)  # the demo's, up already
        annotations = handle.kubectl(
            *("get", "daemonset", "netclaim-agent", "-n", agents.NAMESPACE),
            *("-o", "jsonpath={.spec.template.metadata.annotations}"),
        )
        assert json.loads(annotations)["netclaim.dev/image-digest"] == built.digest
    finally:
        cluster.down(name)


def test_the_arm64_image_holds_only_aarch64_programs_and_the_amd64_images_packages() -> None:
    arm = Image(agent_image.ensure(arch="arm64").path)
    amd = Image(agent_image.ensure().path)
    assert arm.config["architecture"] == "arm64" and amd.config["architecture"] == "amd64"
    assert len(arm.elf_machines) > 100, "sampled too few ELF files"
    assert {name for name, machine in arm.elf_machines.items() if machine != EM_AARCH64} == set()
    assert set(amd.elf_machines.values()) == {EM_X86_64}
    assert arm.python == amd.python and len(arm.python) > 20
    assert arm.debian == amd.debian and set(agent_image.debian_packages()) <= arm.debian
    # netclaim's own files are the same, byte-compiled ones included
    ours = {n for n in amd.names if "/netclaim/" in n or n.endswith("/netclaim")}
    assert ours and ours <= arm.names
