"""Locally built images are deterministic OCI layouts that containerd can import by name."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

from netclaim_lab.images import Layer, write_layer, write_oci_archive


def test_archive_is_deterministic_and_named(tmp_path: Path) -> None:
    layer = Layer(
        files={"bin/tool": (b"#!/bin/sh\n", 0o755)},
        symlinks={"bin/alias": "/bin/tool"},
        directories={"bin": 0o755},
    )
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    write_oci_archive(first, "netclaim.local/tool:1", layer, ["/bin/tool"])
    write_oci_archive(second, "netclaim.local/tool:1", layer, ["/bin/tool"])
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as archive:
        index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
        manifest_digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.load(archive.extractfile(f"blobs/sha256/{manifest_digest}"))  # type: ignore[arg-type]
        assert archive.getmember(f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}").size > 0
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == "netclaim.local/tool:1"


def _tree(root: Path) -> None:
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "tool").write_bytes(b"#!/bin/sh\n")
    (root / "usr" / "bin" / "tool").chmod(0o755)
    (root / "usr" / "bin" / "alias").symlink_to("tool")
    os.link(root / "usr" / "bin" / "tool", root / "usr" / "bin" / "hardlink")
    (root / "dev").mkdir()
    (root / "dev" / "leftover").write_text("the runtime mounts /dev")
    (root / "etc").mkdir()
    (root / "etc" / "os-release").write_text("ID=debian\n")
    os.mkfifo(root / "etc" / "fifo")


def test_directory_layer_is_the_same_bytes_for_the_same_tree(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _tree(first)
    _tree(second)
    os.utime(second / "etc" / "os-release", (2_000_000_000, 2_000_000_000))  # later than the clamp
    os.utime(first / "etc" / "os-release", (1_900_000_000, 1_900_000_000))
    write_layer(first, tmp_path / "a.tar", mtime=1_000, contents_skipped=["dev"])
    write_layer(second, tmp_path / "b.tar", mtime=1_000, contents_skipped=["dev"])
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    with tarfile.open(tmp_path / "a.tar") as archive:
        members = archive.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert "dev" in names and "dev/leftover" not in names and "etc/fifo" not in names
    assert {m.mtime for m in members} == {1_000}
    assert {(m.uname, m.gname) for m in members} == {("", "")}
    kinds = {m.name: m for m in members}
    assert kinds["usr/bin/alias"].issym() and kinds["usr/bin/alias"].linkname == "tool"
    # the first name in order holds the content, the later one links to it
    assert kinds["usr/bin/hardlink"].isreg() and kinds["usr/bin/hardlink"].mode == 0o755
    assert kinds["usr/bin/tool"].islnk() and kinds["usr/bin/tool"].linkname == "usr/bin/hardlink"


def test_directory_layer_of_chosen_paths(tmp_path: Path) -> None:
    _tree(tmp_path / "root")
    write_layer(tmp_path / "root", tmp_path / "l.tar", mtime=0, paths=["usr/bin/tool", "etc/os-release"])
    with tarfile.open(tmp_path / "l.tar") as archive:
        assert archive.getnames() == ["etc/os-release", "usr/bin/tool"]


def test_archive_of_layer_files_keeps_their_order_and_entrypoint(tmp_path: Path) -> None:
    _tree(tmp_path / "root")
    write_layer(tmp_path / "root", tmp_path / "base.tar", mtime=0, paths=["etc/os-release"])
    write_layer(tmp_path / "root", tmp_path / "top.tar", mtime=0, paths=["usr/bin/tool"])
    digest = write_oci_archive(
        tmp_path / "image.tar",
        "registry.example.com/tool:2",
        [tmp_path / "base.tar", tmp_path / "top.tar"],
        ["run"],
        entrypoint=["/usr/bin/tool"],
    )
    with tarfile.open(tmp_path / "image.tar") as archive:
        index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
        assert index["manifests"][0]["digest"] == digest
        manifest = json.load(archive.extractfile(f"blobs/sha256/{digest[7:]}"))  # type: ignore[arg-type]
        config = json.load(archive.extractfile(f"blobs/sha256/{manifest['config']['digest'][7:]}"))  # type: ignore[arg-type]
    layers = [tmp_path / "base.tar", tmp_path / "top.tar"]
    expected = ["sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() for p in layers]
    assert [layer["digest"] for layer in manifest["layers"]] == expected
    assert config["rootfs"]["diff_ids"] == expected
    assert config["config"]["Entrypoint"] == ["/usr/bin/tool"] and config["config"]["Cmd"] == ["run"]
