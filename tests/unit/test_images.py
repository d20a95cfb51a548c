"""Locally built images are deterministic OCI layouts that containerd can import by name."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from netclaim.cluster.images import Layer, write_oci_archive


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
