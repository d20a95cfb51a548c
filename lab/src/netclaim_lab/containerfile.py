"""The repository's Containerfile built on this machine as a user builds it: by buildah (Debian's package),
then saved as an OCI archive the lab's nodes import (`netclaim-lab cluster image --containerfile`, and
`netclaim-lab demo --image` runs the demo on it).

No registry is reachable here, so the base its FROM names (Debian bookworm, as the registry's
debian:bookworm-slim is: mmdebstrap's variant apt) is made first from the machine's Debian mirror and
tagged with that name; the build then runs with --pull=never. What is this machine's and not the
recipe's is passed on the command line: the host network, and the host's CA certificates as the secret
the recipe hands pip (this machine reaches PyPI through a TLS proxy whose CA only the host trusts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from netclaim.errors import PrerequisiteError
from netclaim_lab import agent_image
from netclaim_lab.binaries import build_lock, cache_root
from netclaim_lab.layout import REPO_ROOT

CONTAINERFILE = REPO_ROOT / "Containerfile"
BASE_REF = "docker.io/library/debian:bookworm-slim"
# buildah's own storage of this machine's builds: vfs, since overlay mounts are not allowed in every
# sandbox that runs the lab, and apart from any storage a user's podman keeps
STORAGE = ("--storage-driver=vfs",)
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"


def _buildah(*args: str, what: str, log: TextIO | None = None) -> str:
    command = ["buildah", *STORAGE, f"--root={cache_root() / 'buildah'}", *args]
    done = subprocess.run(command, capture_output=log is None, text=True, stdout=log, stderr=log)
    if done.returncode != 0:
        said = (done.stderr or "").strip()[-2000:] if log is None else "(its output is above)"
        raise PrerequisiteError(f"{what} failed (exit {done.returncode}): {said}")
    return done.stdout or ""


def _check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise PrerequisiteError("building the Containerfile here needs root (buildah, chroot isolation)")
    for program, package in (("buildah", "buildah"), ("mmdebstrap", "mmdebstrap")):
        if not shutil.which(program):
            raise PrerequisiteError(f"{program} is missing: apt-get install {package}")


def _has_image(reference: str) -> bool:
    try:
        _buildah("inspect", "--type=image", reference, what=f"looking for {reference}")
    except PrerequisiteError:
        return False
    return True


def _make_base(log: TextIO) -> None:
    """BASE_REF from the machine's Debian mirror (what the registry's image is: variant apt, no docs)."""
    with tempfile.TemporaryDirectory() as scratch:
        tarball = Path(scratch) / "base.tar"
        command = [
            "mmdebstrap", "--variant=apt", "--format=tar", "--quiet",
            "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
            *agent_image.host_apt_options(),
            agent_image.SUITE, str(tarball), *agent_image.apt_sources(),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise PrerequisiteError(f"mmdebstrap of {BASE_REF} failed: {done.stderr.strip()[-2000:]}")
        container = _buildah("from", "--quiet", "scratch", what="a scratch container").strip()
        try:
            _buildah("add", "--quiet", container, str(tarball), "/", what="adding the base's files")
            _buildah("config", "--cmd=/bin/bash", container, what="the base's command")
            _buildah("commit", "--quiet", container, BASE_REF, what=f"committing {BASE_REF}")
        finally:
            _buildah("rm", container, what="removing the scratch container")
    print(f"  made {BASE_REF} from Debian's packages", file=log, flush=True)


def build(reference: str = agent_image.DEFAULT_REF, log: TextIO = sys.stderr) -> agent_image.ImageArchive:
    """The Containerfile's image of the checkout as an OCI archive named `reference` (minutes)."""
    agent_image.check_reference(reference)
    _check_prerequisites()
    root = cache_root() / "containerfile"
    root.mkdir(parents=True, exist_ok=True)
    with build_lock(root):
        started = time.monotonic()
        if not _has_image(BASE_REF):
            _make_base(log)
        _buildah(
            "build", "--pull=never", "--network=host", "--isolation=chroot", "--layers=false",
            f"--secret=id=ca-certificates,src={HOST_CA}",
            f"--file={CONTAINERFILE}", f"--tag={reference}", str(REPO_ROOT),
            what="buildah build of the Containerfile", log=log,
        )  # fmt: skip
        archive = root / "netclaim-containerfile.tar"
        archive.unlink(missing_ok=True)
        _buildah("push", "--quiet", reference, f"oci-archive:{archive}:{reference}", what="saving the image")
        print(f"Containerfile image ready in {time.monotonic() - started:.0f} s: {archive}", file=log)
        return agent_image.describe(archive)
