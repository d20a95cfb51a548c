"""OCI images built on this machine (no registry is reachable): pause, and busybox from Debian.

Each image is one uncompressed layer written deterministically (sorted entries, mtime 0), so
the same inputs give the same digests and containerd imports them as already known.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from netclaim.errors import PrerequisiteError

PAUSE_IMAGE = "netclaim.local/pause:1"
BUSYBOX_IMAGE = "netclaim.local/busybox:1.35"
BUSYBOX_BINARY = Path("/bin/busybox")
_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Layer:
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path -> (content, mode)
    symlinks: dict[str, str] = field(default_factory=dict)  # path -> target
    directories: dict[str, int] = field(default_factory=dict)  # path -> mode

    def tar(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
            entries: list[tuple[str, str]] = [(p, "d") for p in self.directories]
            entries += [(p, "f") for p in self.files] + [(p, "l") for p in self.symlinks]
            for path, kind in sorted(entries):
                info = tarfile.TarInfo(path)
                info.mtime = 0
                if kind == "d":
                    info.type, info.mode = tarfile.DIRTYPE, self.directories[path]
                    archive.addfile(info)
                elif kind == "l":
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, self.symlinks[path], 0o777
                    archive.addfile(info)
                else:
                    content, info.mode = self.files[path]
                    info.size = len(content)
                    archive.addfile(info, io.BytesIO(content))
        return buffer.getvalue()


def _blob(archive: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest[7:]}")
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    archive.addfile(info, io.BytesIO(data))
    return digest, len(data)


def _file_digest(path: Path) -> str:
    with path.open("rb") as source:
        return "sha256:" + hashlib.file_digest(source, "sha256").hexdigest()


def _file_blob(archive: tarfile.TarFile, path: Path, digest: str) -> int:
    """A blob streamed from a file (a root filesystem's layer is too big to hold twice in memory)."""
    info = tarfile.TarInfo(f"blobs/sha256/{digest[7:]}")
    info.size, info.mtime, info.mode = path.stat().st_size, 0, 0o644
    with path.open("rb") as source:
        archive.addfile(info, source)
    return info.size


def write_layer(
    root: Path,
    output: Path,
    mtime: int,
    contents_skipped: Collection[str] = (),
    paths: Collection[str] | None = None,
) -> None:
    """A layer tar of the directory tree `root` (or of its `paths` alone, relative), the same bytes for
    the same tree: entries sorted, owners numeric with no names, mtimes clamped to `mtime`
    (SOURCE_DATE_EPOCH), hard links kept, device nodes and sockets left out. The directories named in
    `contents_skipped` (like "dev") are kept empty: the runtime mounts them."""
    if paths is None:
        paths = []
        for directory, subdirectories, files in os.walk(root):
            relative = os.path.relpath(directory, root)
            if relative in contents_skipped:
                subdirectories.clear()
                continue
            prefix = "" if relative == "." else relative + "/"
            paths += [prefix + name for name in subdirectories + files]
    output.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(output, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(paths):  # a parent is a prefix of its children, so it comes first
            info = archive.gettarinfo(root / path, arcname=path)
            if info is None or not (info.isreg() or info.isdir() or info.issym() or info.islnk()):
                continue
            info.mtime = min(int(info.mtime), mtime)
            info.uname = info.gname = ""
            if info.isreg():
                with (root / path).open("rb") as content:
                    archive.addfile(info, content)
            else:
                archive.addfile(info)


def write_oci_archive(
    path: Path,
    reference: str,
    layers: Layer | Sequence[Path],
    command: list[str],
    entrypoint: list[str] | None = None,
    architecture: str = "amd64",
) -> str:
    """An OCI image layout tarball that `ctr images import` names `reference`; its manifest digest.

    `layers` is one Layer, or layer tar files from the bottom up (write_layer), streamed from disk."""
    if isinstance(layers, Layer):
        layer_tar = layers.tar()
        blobs: list[tuple[str, bytes | Path]] = [
            ("sha256:" + hashlib.sha256(layer_tar).hexdigest(), layer_tar)
        ]
    else:
        blobs = [(_file_digest(layer), layer) for layer in layers]
    image_config: dict[str, object] = {"Env": [_PATH_ENV], "Cmd": command, "WorkingDir": "/"}
    if entrypoint is not None:
        image_config["Entrypoint"] = entrypoint
    config = json.dumps(
        {
            "architecture": architecture,
            "os": "linux",
            "config": image_config,
            "rootfs": {"type": "layers", "diff_ids": [digest for digest, _ in blobs]},
        },
        sort_keys=True,
    ).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with tarfile.open(partial, mode="w") as archive:
        config_digest, config_size = _blob(archive, config)
        sizes = [
            _file_blob(archive, blob, digest) if isinstance(blob, Path) else _blob(archive, blob)[1]
            for digest, blob in blobs
        ]
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config_digest,
                    "size": config_size,
                },
                "layers": [
                    {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size}
                    for (digest, _), size in zip(blobs, sizes, strict=True)
                ],
            },
            sort_keys=True,
        ).encode()
        manifest_digest, manifest_size = _blob(archive, manifest)
        index = json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": manifest_digest,
                        "size": manifest_size,
                        "platform": {"architecture": architecture, "os": "linux"},
                        "annotations": {
                            "io.containerd.image.name": reference,
                            "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
                        },
                    }
                ],
            },
            sort_keys=True,
        ).encode()
        for name, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            archive.addfile(info, io.BytesIO(data))
    partial.rename(path)
    return manifest_digest


def layer_digest(layer: Layer) -> str:
    """A short name of the layer's content, for the archive's file name (same content, same file)."""
    return hashlib.sha256(layer.tar()).hexdigest()[:12]


def base_directories() -> dict[str, int]:
    return {
        d: 0o755
        for d in (
            "bin",
            "dev",
            "etc",
            "proc",
            "sys",
            "root",
            "usr",
            "usr/bin",
            "usr/sbin",
            "sbin",
            "var",
            "run",
        )
    } | {"tmp": 0o1777}


def busybox_layer() -> Layer:
    if not BUSYBOX_BINARY.is_file():
        raise PrerequisiteError(f"{BUSYBOX_BINARY} is missing: apt-get install busybox-static")
    applets = subprocess.run(
        [str(BUSYBOX_BINARY), "--list-full"], capture_output=True, text=True, check=True
    ).stdout.split()
    layer = Layer(directories=base_directories())
    layer.files["bin/busybox"] = (BUSYBOX_BINARY.read_bytes(), 0o755)
    layer.files["etc/passwd"] = (
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
        0o644,
    )
    layer.files["etc/group"] = (b"root:x:0:\nnogroup:x:65534:\n", 0o644)
    for applet in applets:
        if applet != "bin/busybox" and applet.split("/")[0] in {"bin", "sbin", "usr"}:
            layer.symlinks[applet] = "/bin/busybox"
    return layer


def pause_layer(pause_binary: Path) -> Layer:
    return Layer(
        files={"pause": (pause_binary.read_bytes(), 0o755)},
        directories={"dev": 0o755, "proc": 0o755, "sys": 0o755},
    )


def build_images(directory: Path, pause_binary: Path) -> dict[str, Path]:
    """Write both archives (once per input) and return {reference: archive path}."""
    archives = {}
    for reference, layer, command in (
        (PAUSE_IMAGE, pause_layer(pause_binary), ["/pause"]),
        (BUSYBOX_IMAGE, busybox_layer(), ["sh"]),
    ):
        path = directory / f"{reference.split('/')[1].replace(':', '-')}-{layer_digest(layer)}.tar"
        if not path.is_file():
            write_oci_archive(path, reference, layer, command)
        archives[reference] = path
    return archives
