"""`make image` for real: two builds from nothing give the same digest, the cache answers at once, and
the image's own programs run (chroot into its unpacked layers). Needs root, mmdebstrap and the package
registries; about 40 s a build on 2 cores."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netclaim_lab import agent_image
from netclaim_lab.agent_image import ImageArchive
from tests.packaging import lab_paths

pytestmark = pytest.mark.image
MIB = 1024 * 1024


@dataclass
class Builds:
    first: ImageArchive
    second: ImageArchive
    seconds: tuple[float, float]
    cache: Path  # the first build's


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builds]:
    if os.geteuid() != 0:
        pytest.fail("building the agent image needs root (mmdebstrap, chroot): run `sudo make test`")
    if not shutil.which("mmdebstrap"):
        pytest.fail("mmdebstrap is missing: apt-get install mmdebstrap (or run `make deps`)")
    scratch = tmp_path_factory.mktemp("image")
    made: list[ImageArchive] = []
    seconds: list[float] = []
    for name in ("first", "second"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("NETCLAIM_CACHE", str(scratch / name))  # nothing shared, not even the base layer
            started = time.monotonic()
            made.append(agent_image.ensure(rebuild=True))
            seconds.append(time.monotonic() - started)
    yield Builds(made[0], made[1], (seconds[0], seconds[1]), scratch / "first")
    shutil.rmtree(scratch)  # ~1 GB


def test_two_builds_from_nothing_are_the_same_image(builds: Builds, figures: Callable[[str], None]) -> None:
    first, second = builds.first, builds.second
    figures(
        f"agent image {first.reference}: {first.size_bytes / MIB:.1f} MiB, layers "
        f"{' + '.join(f'{s / MIB:.1f}' for s in first.layer_sizes)} MiB uncompressed; built from "
        f"nothing in {builds.seconds[0]:.0f} s and {builds.seconds[1]:.0f} s; {first.digest} both times"
    )
    assert first.path != second.path
    assert first.digest == second.digest
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.reference == agent_image.DEFAULT_REF


def test_the_cache_answers_and_another_tag_reuses_the_layers(
    builds: Builds, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETCLAIM_CACHE", str(builds.cache))
    built_before = {  # the layers and archives, not the build lock every call opens
        p: p.stat().st_mtime_ns for p in builds.cache.rglob("*") if p.is_file() and p.name != ".build.lock"
    }
    cached = agent_image.ensure()
    assert cached == builds.first
    rewritten = [p for p, mtime in built_before.items() if not p.exists() or p.stat().st_mtime_ns != mtime]
    assert built_before and not rewritten, rewritten  # answered from the cache: nothing built again
    other = agent_image.ensure("localhost:5000/netclaim:dev")
    assert other.reference == "localhost:5000/netclaim:dev"
    assert other.digest == builds.first.digest  # the tag lives in the index, not in the manifest
    exported = agent_image.export(other, builds.cache / "out" / "netclaim-image.tar")
    assert agent_image.describe(exported.path) == exported


def _blob(image: tarfile.TarFile, digest: str) -> bytes:
    member = image.extractfile(f"blobs/sha256/{digest[7:]}")
    assert member is not None
    return member.read()


def _manifest(image: tarfile.TarFile) -> Any:
    index = json.loads(image.extractfile("index.json").read())  # type: ignore[union-attr]
    return json.loads(_blob(image, index["manifests"][0]["digest"]))


def _unpack(archive: Path, rootfs: Path) -> dict[str, object]:
    """The image's root filesystem (its layers in order) and its config."""
    with tarfile.open(archive) as image:
        manifest = _manifest(image)
        rootfs.mkdir()
        for layer in manifest["layers"]:
            layer_tar = rootfs.parent / "layer.tar"
            layer_tar.write_bytes(_blob(image, layer["digest"]))
            subprocess.run(["tar", "-C", str(rootfs), "-xpf", str(layer_tar), "--numeric-owner"], check=True)
            layer_tar.unlink()
        config: dict[str, object] = json.loads(_blob(image, manifest["config"]["digest"]))
        return config


def _files(archive: Path) -> list[str]:
    """Every path in the image's layers, as its tar members name them."""
    with tarfile.open(archive) as image:
        paths = []
        for layer in _manifest(image)["layers"]:
            with tarfile.open(fileobj=io.BytesIO(_blob(image, layer["digest"]))) as layer_tar:
                paths += [name.removeprefix("./") for name in layer_tar.getnames()]
        return paths


def test_the_image_holds_the_product_only(builds: Builds) -> None:
    """netclaim's wheel and the packages it needs: no lab code, nothing only the lab installs."""
    paths = _files(builds.first.path)
    assert f"{agent_image.SITE_PACKAGES}/netclaim/agent/main.py" in paths
    assert not lab_paths(paths)


def _chroot(rootfs: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chroot", str(rootfs), *command],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/local/bin:/usr/sbin:/usr/bin", "LC_ALL": "C.UTF-8"},
    )


def test_the_image_runs_netclaim_and_the_plugins_tools(builds: Builds, tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    config = _unpack(builds.first.path, rootfs)
    assert config["config"] == {
        "Entrypoint": ["/usr/bin/tini", "--", "/usr/local/bin/netclaim"],
        "Cmd": ["agent"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": "/",
    }
    help_text = _chroot(rootfs, "python3", "-m", "netclaim", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "agent" in help_text.stdout
    entrypoint = _chroot(rootfs, *config["config"]["Entrypoint"], "agent", "--help")
    assert entrypoint.returncode == 0 and "--cni-bin-dir" in entrypoint.stdout, entrypoint.stderr
    # the controller runs as 65532 on a read-only root: every module it needs is compiled already
    imports = subprocess.run(
        ["chroot", "--userspec=65532:65532", str(rootfs), "python3", "-c", "import netclaim.controller.main"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert imports.returncode == 0, imports.stderr
    iptables = _chroot(rootfs, "iptables", "--version")
    assert iptables.returncode == 0 and "nf_tables" in iptables.stdout, iptables.stderr
    nft = _chroot(rootfs, "nft", "--version")
    assert nft.returncode == 0, nft.stderr
    assert _chroot(rootfs, "python3", "-c", "import pip").returncode != 0  # no pip
    for absent in ("usr/bin/gcc", "usr/bin/cc", "usr/bin/apt-get", "usr/bin/pip3"):
        assert not (rootfs / absent).exists(), absent
    docs = [
        p
        for d in ("man", "info", "doc", "locale")
        for p in (rootfs / "usr/share" / d).rglob("*")
        if p.is_file()
    ]
    assert docs and {p.name for p in docs} <= {"copyright", "locale.alias"}  # the licences stay
    assert not any((rootfs / "dev").iterdir())
    assert not (rootfs / "etc" / "resolv.conf").exists() and not (rootfs / "etc" / "hostname").exists()
    sources = list((rootfs / "usr" / "local").rglob("*.py")) + list(
        (rootfs / "usr/lib/python3.11").rglob("*.py")
    )
    compiled = {p.parent / "__pycache__" / f"{p.stem}.cpython-311.pyc" for p in sources}
    assert len(sources) > 1000
    assert not [c for c in compiled if not c.exists()], "modules without their .pyc"
