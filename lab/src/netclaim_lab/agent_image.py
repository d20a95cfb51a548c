"""The agent's container image, built on this machine without a container engine (`make image`).

Two uncompressed layers, each written deterministically (images.write_layer), in one OCI image layout
tarball that `ctr -n k8s.io images import` names (deploy/daemonset.yaml's and controller.yaml's image):

- base: Debian bookworm from the machine's apt mirror by mmdebstrap, variant essential (no apt, no
  compilers; docs, man pages and locales excluded by dpkg) with image/debian-packages.txt, plus the
  hash-pinned image/requirements.lock installed by the host's pip with --target, so that no pip is in
  the image. Rebuilt only when those files or this recipe change.
- netclaim: the product's wheel, built from the checkout's pyproject.toml and src/ only, never lab/
  (image/build-constraints.txt pins its build backend), and the image/netclaim command. A change of
  src/ rebuilds only this small layer, and containerd imports only it again.

Everything Python is byte-compiled inside the image's own interpreter with hash-based .pyc
(PYTHONHASHSEED=0), so start-up is fast with a read-only root filesystem and the bytes do not depend on
when they were made. mmdebstrap runs with SOURCE_DATE_EPOCH and the layers clamp every mtime to it:
the same inputs and the same mirror content give the same image digest (tests/test_image.py builds
twice and compares). A Debian point release or security update changes the base layer; each layer's
contents.txt in the cache says what went in. Results are cached in <cache>/image/, one directory per
inputs hash (NETCLAIM_CACHE moves <cache> from ~/.cache/netclaim), the last few kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from netclaim.errors import PrerequisiteError
from netclaim_lab import images
from netclaim_lab.binaries import build_lock, cache_root
from netclaim_lab.layout import REPO_ROOT

DEFAULT_REF = "registry.example.com/netclaim:0.1.0"
SOURCE_DATE_EPOCH = 1747699200  # 2025-05-20T00:00:00Z: a constant, so no build date reaches the bytes
SUITE = "bookworm"
PYTHON = "3.11"  # Debian bookworm's
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}  # the image's architectures: Debian's name, the wheels'
GLIBC_MINOR = 36  # bookworm's glibc 2.36: the newest manylinux wheels it runs
COMMAND_PATH = "/usr/local/bin/netclaim"
ENTRYPOINT = ["/usr/bin/tini", "--", COMMAND_PATH]
COMMAND = ["agent"]
SITE_PACKAGES = f"usr/local/lib/python{PYTHON}/dist-packages"
IMAGE_DIR = REPO_ROOT / "image"
PACKAGES_FILE = IMAGE_DIR / "debian-packages.txt"
LOCK_FILE = IMAGE_DIR / "requirements.lock"
BUILD_CONSTRAINTS = IMAGE_DIR / "build-constraints.txt"
COMMAND_FILE = IMAGE_DIR / "netclaim"
_BASE_INPUTS = (PACKAGES_FILE, LOCK_FILE, Path(__file__), Path(images.__file__))
_DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",  # the licences stay
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
)
# Host apt settings passed on to mmdebstrap (a snapshot mirror's old Release, a proxy).
_APT_OPTIONS = {
    "Acquire::Check-Valid-Until",
    "Acquire::Check-Date",
    "Acquire::http::Proxy",
    "Acquire::https::Proxy",
}
# Made by the bootstrap for itself, or host-dependent: not in the image (no apt is installed).
_REMOVED = (
    "etc/hostname", "etc/resolv.conf", "etc/apt/sources.list", "etc/apt/sources.list.d",
    "etc/apt/apt.conf.d/99mmdebstrap", "var/lib/apt", "var/cache/apt", "var/log/apt",
    "usr/share/info/dir",  # install-info's index of the info pages we leave out
)  # fmt: skip
_MOUNTED_AT_RUN = ("dev", "proc", "sys", "run", "tmp")  # kept empty: the runtime provides them
_KEEP_BUILDS = 3


@dataclass(frozen=True)
class ImageArchive:
    path: Path
    reference: str
    digest: str  # the manifest's: what `ctr images ls` and the kubelet show
    size_bytes: int
    layer_sizes: tuple[int, ...] = ()


def debian_packages(path: Path = PACKAGES_FILE) -> list[str]:
    return [word for line in path.read_text().splitlines() for word in line.split("#", 1)[0].split()]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(path: Path = LOCK_FILE) -> dict[str, str]:
    return {
        _normalize(m.group(1)): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9][\w.-]*)==(\S+)", path.read_text(), re.MULTILINE)
    }


def project_pins(pyproject: Path = REPO_ROOT / "pyproject.toml") -> dict[str, str]:
    """[project].dependencies as {name: version}; each must be an exact == pin."""
    pins = {}
    for requirement in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        match = re.fullmatch(r"\s*([A-Za-z0-9][\w.-]*)(\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*", requirement)
        if not match:
            raise PrerequisiteError(f"{pyproject}: {requirement!r} is not an exact == pin")
        pins[_normalize(match.group(1))] = match.group(3)
    return pins


def check_lock(pyproject: Path = REPO_ROOT / "pyproject.toml", lock: Path = LOCK_FILE) -> None:
    locked = locked_versions(lock)
    stale = [f"{n}=={v}" for n, v in project_pins(pyproject).items() if locked.get(n) != v]
    if stale:
        raise PrerequisiteError(
            f"{lock} does not match pyproject.toml ({', '.join(stale)}): run "
            "`.venv/bin/netclaim-lab cluster image --relock` and commit it"
        )


def _pip() -> list[str]:
    return [sys.executable, "-m", "pip"]


def _pip_install(target: Path) -> list[str]:
    """pip installing into `target` (site-packages in the image): no dependencies but what is named, no
    .pyc (made later in the image, deterministically)."""
    return [*_pip(), "install", "--quiet", "--no-deps", "--no-compile", f"--target={target}"]


def drop_launchers(site: Path) -> None:
    """Remove the console scripts pip wrote for the host's interpreter, and their lines in each RECORD:
    their shebang names the interpreter's path (the checkout's .venv), so the RECORD's hashes of them made
    the digest depend on where the checkout is."""
    shutil.rmtree(site / "bin", ignore_errors=True)
    for record in sorted(site.glob("*.dist-info/RECORD")):
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(line for line in lines if not line.startswith("../../bin/")))


def _wheel_selection(machine: str = "x86_64") -> list[str]:
    """pip's options for wheels that run on the image's interpreter on `machine`, whatever this host runs."""
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_MINOR, 16, -1)]
    platforms += [f"manylinux2014_{machine}"]
    if machine == "x86_64":
        platforms += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    return [
        *(f"--platform={p}" for p in platforms),
        f"--python-version={PYTHON}",
        "--implementation=cp",
        f"--abi=cp{PYTHON.replace('.', '')}",
        "--only-binary=:all:",
    ]


def relock(log: TextIO = sys.stderr) -> Path:
    """Resolve pyproject.toml's dependencies for the image into LOCK_FILE, each wheel's hash pinned."""
    pins = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    versions: dict[str, dict[str, str]] = {}  # by machine, by package
    hashes: dict[tuple[str, str], set[str]] = {}
    for machine in MACHINES.values():
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "report.json"
            resolve = [*_pip(), "install", "--quiet", "--dry-run", "--ignore-installed"]
            resolve.append(f"--target={scratch}/t")
            subprocess.run([*resolve, *_wheel_selection(machine), f"--report={report}", *pins], check=True)
            resolved = json.loads(report.read_text())["install"]
        for item in resolved:
            name, version = _normalize(item["metadata"]["name"]), item["metadata"]["version"]
            versions.setdefault(machine, {})[name] = version
            digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
            hashes.setdefault((name, version), set()).add(digest)
    first, *others = versions.values()
    if any(other != first for other in others):
        raise PrerequisiteError(f"pip resolves the architectures differently ({versions}): pin what differs")
    lines = [
        "# The agent image's Python packages: pyproject.toml's [project].dependencies and all they pull in,",
        f"# resolved for Debian {SUITE}'s CPython {PYTHON} (manylinux, glibc 2.{GLIBC_MINOR}),",
        f"# each wheel of each architecture ({', '.join(MACHINES.values())}) hash-pinned.",
        "# Regenerate after changing a pin: .venv/bin/netclaim-lab cluster image --relock",
    ]
    for (name, version), digests in sorted(hashes.items()):
        lines.append(f"{name}=={version} \\")
        ordered = sorted(digests)
        lines += [f"    --hash=sha256:{d}" + (" \\" if d != ordered[-1] else "") for d in ordered]
    LOCK_FILE.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(hashes)} pinned packages to {LOCK_FILE}", file=log)
    return LOCK_FILE


def files_hash(seed: str, paths: list[Path], root: Path = REPO_ROOT) -> str:
    """A hash of the files' names (relative to `root`) and contents, after `seed`."""
    digest = hashlib.sha256(seed.encode() + b"\0")
    for path in paths:
        name = path.relative_to(root) if path.is_relative_to(root) else Path(path.name)
        digest.update(str(name).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def source_files(root: Path = REPO_ROOT) -> list[Path]:
    """What netclaim's wheel is made of: pyproject.toml and src/ without caches, in a stable order."""
    files = [root / "pyproject.toml"]
    for directory, subdirectories, names in os.walk(root / "src"):
        subdirectories[:] = sorted(
            d for d in subdirectories if d != "__pycache__" and not d.endswith(".egg-info")
        )
        files += [Path(directory) / n for n in sorted(names) if not n.endswith(".pyc")]
    return files


def base_hash(arch: str = "amd64") -> str:
    """The base layer's inputs: the package list, the lock, this recipe and the architecture."""
    return files_hash("base" if arch == "amd64" else f"base-{arch}", list(_BASE_INPUTS))


def inputs_hash(arch: str = "amd64") -> str:
    """The whole image's inputs: the base layer's, src/, pyproject.toml and the other image/ files."""
    return files_hash(base_hash(arch), [*source_files(), BUILD_CONSTRAINTS, COMMAND_FILE])


def _host_sources(etc: Path) -> Iterator[tuple[list[str], str, list[str], list[str], str]]:
    """(types, URI, suites, components, keyring) of each entry in apt's one-line and deb822 files."""
    for path in [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]:
        for line in path.read_text().splitlines() if path.is_file() else []:
            entry = re.match(r"\s*(deb)\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s+(.*)", line.split("#", 1)[0])
            if entry:
                key = re.search(r"signed-by=(\S+)", entry.group(2) or "")
                components = entry.group(5).split()
                yield ["deb"], entry.group(3), [entry.group(4)], components, key.group(1) if key else ""
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.MULTILINE))
            if fields.get("Enabled", "yes").lower() == "no":
                continue
            key = fields.get("Signed-By", "")  # a path, or an inline key we do not pass on
            for uri in fields.get("URIs", "").split():
                yield (
                    fields.get("Types", "").split(),
                    uri,
                    fields.get("Suites", "").split(),
                    fields.get("Components", "").split(),
                    key if key.startswith("/") else "",
                )


def apt_sources(etc: Path = Path("/etc/apt")) -> list[str]:
    """The host's Debian SUITE entries (main) as one-line sources, the first of each mirror and suite (apt
    refuses one source with two Signed-By keys); deb.debian.org when it has none."""
    suites = {SUITE, f"{SUITE}-updates", f"{SUITE}-security"}
    lines: dict[tuple[str, str], str] = {}
    for types, uri, entry_suites, components, key in _host_sources(etc):
        for suite in entry_suites:
            if "deb" in types and suite in suites and "main" in components:
                signed = f"[signed-by={key}] " if key else ""
                lines.setdefault((uri, suite), f"deb {signed}{uri} {suite} main")
    return list(lines.values()) or [
        f"deb http://deb.debian.org/debian {SUITE} main",
        f"deb http://deb.debian.org/debian {SUITE}-updates main",
        f"deb http://deb.debian.org/debian-security {SUITE}-security main",
    ]


def host_apt_options() -> list[str]:
    dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, check=False).stdout
    return [
        f"--aptopt={line.rstrip(';')}" for line in dump.splitlines() if line.split(" ", 1)[0] in _APT_OPTIONS
    ]


def _run(command: list[str], what: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise PrerequisiteError(
            f"{what} failed ({' '.join(command[:3])} ... exited {result.returncode}):\n"
            f"{(result.stdout + result.stderr)[-4000:]}"
        )
    return result.stdout


def _chroot_env() -> dict[str, str]:
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",  # frozenset constants in .pyc are then in one order
        "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH),
    }


def _compile(rootfs: Path, directories: list[str]) -> None:
    for directory in directories:
        for cache in sorted((rootfs / directory).rglob("__pycache__"), reverse=True):
            shutil.rmtree(cache)
    compileall = ["python3", "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash"]
    _chroot(rootfs, [*compileall, *(f"/{d}" for d in directories)], "byte-compiling in the image")


def _chroot(rootfs: Path, command: list[str], what: str) -> str:
    return _run(["chroot", str(rootfs), *command], what, env=_chroot_env())


def _check_prerequisites(arch: str) -> None:
    if os.geteuid() != 0:
        raise PrerequisiteError("building the agent image needs root (mmdebstrap --mode=root, chroot)")
    if not shutil.which("mmdebstrap"):
        raise PrerequisiteError("mmdebstrap is missing: apt-get install mmdebstrap (or run `make deps`)")
    if arch != "amd64":
        if not shutil.which("arch-test"):  # mmdebstrap's check that a foreign architecture's programs run
            raise PrerequisiteError("arch-test is missing: apt-get install arch-test")
        handler = Path("/proc/sys/fs/binfmt_misc") / f"qemu-{MACHINES[arch]}"
        if not handler.is_file() or "enabled" not in handler.read_text():
            raise PrerequisiteError(
                f"the {arch} image's programs run here under qemu-user: apt-get install qemu-user-static, "
                f"then make sure {handler} is enabled (`mount -t binfmt_misc binfmt_misc "
                "/proc/sys/fs/binfmt_misc` if the directory is empty, then `update-binfmts --enable`)"
            )


def _bootstrap(rootfs: Path, arch: str) -> None:
    command = [
        "mmdebstrap", "--mode=root", "--variant=essential", "--format=directory", "--quiet",
        f"--architectures={arch}",
        # usr-is-merged instead of the usrmerge package (which pulls in perl)
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        f"--include={','.join(debian_packages())}",
        *(f"--dpkgopt={option}" for option in _DPKG_OPTIONS),
        *host_apt_options(),
        SUITE, str(rootfs), *apt_sources(),
    ]  # fmt: skip
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH), "LC_ALL": "C.UTF-8"}
    _run(command, f"mmdebstrap of Debian {SUITE}", env=env)
    for path in _REMOVED:
        target = rootfs / path
        if target.is_dir() and not target.is_symlink():
            _remove(target)
        else:
            target.unlink(missing_ok=True)
    for leftover in [*rootfs.glob("var/lib/dpkg/*-old"), *rootfs.glob("var/cache/debconf/*-old")]:
        leftover.unlink()
    if not (rootfs / "usr" / "bin" / f"python{PYTHON}").is_file():
        raise PrerequisiteError(f"{SUITE}'s python3 is not {PYTHON}, which image/requirements.lock is for")


def _check_libraries(rootfs: Path, site: Path) -> None:
    """Every shared library the wheels bring finds what it links in the image (image/debian-packages.txt)."""
    libraries = sorted(f"/{p.relative_to(rootfs)}" for p in site.rglob("*.so*") if p.is_file())
    found = _chroot(rootfs, ["ldd", *libraries], "ldd of the wheels' libraries") if libraries else ""
    missing = sorted({line.split()[0] for line in found.splitlines() if "not found" in line})
    if missing:
        raise PrerequisiteError(f"the image lacks {', '.join(missing)}: add its package to {PACKAGES_FILE}")


def _contents(rootfs: Path) -> str:
    packages = _chroot(rootfs, ["dpkg-query", "-W", "-f=${Package} ${Version}\\n"], "listing packages")
    python = sorted(p.name.removesuffix(".dist-info") for p in (rootfs / SITE_PACKAGES).glob("*.dist-info"))
    return "# Debian\n" + packages + "# Python\n" + "".join(f"{p}\n" for p in python)


def _build_base(work: Path, output: Path, arch: str, log: TextIO) -> None:
    rootfs = work / "rootfs"
    started = time.monotonic()
    _bootstrap(rootfs, arch)
    print(f"  Debian {SUITE} root filesystem: {time.monotonic() - started:.0f} s", file=log, flush=True)
    site = rootfs / SITE_PACKAGES
    wheels = _wheel_selection(MACHINES[arch])
    _run([*_pip_install(site), "--require-hashes", *wheels, "-r", str(LOCK_FILE)], "pip install")
    drop_launchers(site)
    _check_libraries(rootfs, site)
    _compile(rootfs, [f"usr/lib/python{PYTHON}", "usr/lib/python3/dist-packages", SITE_PACKAGES])
    output.mkdir(parents=True)
    (output / "contents.txt").write_text(_contents(rootfs))
    images.write_layer(rootfs, output / "layer.tar", SOURCE_DATE_EPOCH, _MOUNTED_AT_RUN)
    print(f"  base layer: {time.monotonic() - started:.0f} s", file=log, flush=True)


def build_wheel(work: Path) -> Path:
    """netclaim's wheel, the one the image installs, from a copy of the product's sources (source_files: no
    lab); a copy because an in-tree build would leave build/lib behind."""
    source = work / "source"
    for path in source_files():
        target = source / path.relative_to(REPO_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    wheels = work / "wheels"
    build = [*_pip(), "wheel", "--quiet", "--no-deps", f"--build-constraint={BUILD_CONSTRAINTS}"]
    _run(
        [*build, f"--wheel-dir={wheels}", str(source)],
        "building netclaim's wheel",
        env={**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)},
    )
    (wheel,) = wheels.glob("netclaim-*.whl")
    return wheel


def _build_netclaim(base_layer: Path, work: Path, output: Path, log: TextIO) -> None:
    started = time.monotonic()
    rootfs = work / "rootfs"
    rootfs.mkdir()
    _run(["tar", "-C", str(rootfs), "-xf", str(base_layer)], "unpacking the base layer")
    site = rootfs / SITE_PACKAGES
    before = {p.name for p in site.iterdir()}
    wheel = build_wheel(work)
    version = wheel.name.split("-")[1]
    pin = f"netclaim=={version}"
    _run([*_pip_install(site), "--no-index", f"--find-links={wheel.parent}", pin], "pip install netclaim")
    drop_launchers(site)  # our own command is image/netclaim
    added = sorted({p.name for p in site.iterdir()} - before)
    command = rootfs / COMMAND_PATH.lstrip("/")
    shutil.copyfile(COMMAND_FILE, command)
    command.chmod(0o755)
    _compile(rootfs, [f"{SITE_PACKAGES}/{name}" for name in added if (site / name).is_dir()])
    smoke = [
        "python3",
        "-B",
        "-c",
        "import netclaim.agent.main, netclaim.controller.main",
    ]  # -B: no stray .pyc
    _chroot(rootfs, smoke, "importing netclaim in the image")
    paths = [COMMAND_PATH.lstrip("/")]
    for name in added:
        paths.append(f"{SITE_PACKAGES}/{name}")
        for directory, subdirectories, names in os.walk(site / name):
            relative = Path(directory).relative_to(rootfs)
            paths += [str(relative / n) for n in subdirectories + names]
    output.mkdir(parents=True)
    (output / "contents.txt").write_text("".join(f"{p}\n" for p in sorted(paths)))
    images.write_layer(rootfs, output / "layer.tar", SOURCE_DATE_EPOCH, paths=paths)
    print(f"  netclaim layer: {time.monotonic() - started:.0f} s", file=log, flush=True)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    points = [line.split()[4].encode().decode("unicode_escape") for line in mounts]
    return [p for p in points if p.startswith(prefix)]


def _remove(path: Path) -> None:
    """rmtree, unless something is still mounted below (a crashed chroot's /proc): never into the host."""
    if not path.exists():
        return
    mounted = _mounts_under(path)
    if mounted:
        raise PrerequisiteError(f"{', '.join(mounted)} still mounted: unmount it, then remove {path}")
    shutil.rmtree(path)


@contextlib.contextmanager
def _staging(target: Path) -> Iterator[Path]:
    """A scratch directory beside `target`; its `out` becomes `target` when the block succeeds."""
    work = target.with_name(target.name + ".partial")
    _remove(work)
    work.mkdir(parents=True)
    try:
        yield work
        _remove(target)
        (work / "out").rename(target)
    finally:
        _remove(work)


def _prune(root: Path, base: bool, keep: str) -> None:
    """Keep the last _KEEP_BUILDS builds of one kind (base layers are ~200 MB), and always `keep`."""
    builds = [
        p
        for p in root.iterdir()
        if p.is_dir() and not p.name.endswith(".partial") and p.name.startswith("base-") == base
    ]
    builds.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in builds[_KEEP_BUILDS:]:
        if old.name != keep:
            _remove(old)


def check_reference(reference: str) -> str:
    name, _, tag = reference.rpartition(":")
    if not name or "/" in tag or not re.fullmatch(r"[\w][\w.-]{0,127}", tag):
        raise PrerequisiteError(f"{reference!r}: an image reference with a tag is expected (name:tag)")
    return reference


def _archive_name(reference: str) -> str:
    return re.sub(r"[^\w.-]+", "_", reference) + ".tar"


def _member_json(archive: tarfile.TarFile, name: str) -> Any:
    member = archive.extractfile(name)
    if member is None:
        raise PrerequisiteError(f"{name} is missing from the image archive")
    return json.load(member)


def describe(path: Path) -> ImageArchive:
    """What an archive holds: its reference, manifest digest and layer sizes (from its index.json)."""
    with tarfile.open(path) as archive:
        entry = _member_json(archive, "index.json")["manifests"][0]
        manifest = _member_json(archive, f"blobs/sha256/{entry['digest'][7:]}")
        layers = tuple(int(layer["size"]) for layer in manifest["layers"])
    names = entry["annotations"]  # ours and ctr's name the image this way; buildah's the OCI way
    name = names.get("io.containerd.image.name") or names["org.opencontainers.image.ref.name"]
    return ImageArchive(path, name, entry["digest"], path.stat().st_size, layers)


def ensure(
    tag: str = DEFAULT_REF, *, arch: str = "amd64", rebuild: bool = False, log: TextIO = sys.stderr
) -> ImageArchive:
    """The image archive of the current inputs named `tag`, for `arch` (MACHINES): from the cache, else
    built (minutes; another architecture's maintainer scripts, byte-compiling and import check run under
    qemu-user); `rebuild` builds every layer afresh (the reproducibility check)."""
    check_reference(tag)
    check_lock()
    if arch not in MACHINES:
        raise PrerequisiteError(f"architecture {arch!r}: the image is built for {', '.join(MACHINES)}")
    root = cache_root() / "image"
    base, full = root / f"base-{base_hash(arch)}", root / inputs_hash(arch)
    with build_lock(root):
        started = time.monotonic()
        archive = full / _archive_name(tag)
        if not rebuild and archive.is_file():
            os.utime(full)
            return describe(archive)
        _check_prerequisites(arch)
        if rebuild or not (base / "layer.tar").is_file():
            print(
                f"building the agent image's base layer (Debian {SUITE}, Python packages)",
                file=log,
                flush=True,
            )
            with _staging(base) as work:
                _build_base(work, work / "out", arch, log)
        if rebuild or not (full / "layer.tar").is_file():
            print("building the agent image's netclaim layer", file=log, flush=True)
            with _staging(full) as work:
                _build_netclaim(base / "layer.tar", work, work / "out", log)
        layers = [base / "layer.tar", full / "layer.tar"]
        images.write_oci_archive(archive, tag, layers, COMMAND, ENTRYPOINT, architecture=arch)
        print(f"agent image ready in {time.monotonic() - started:.0f} s: {archive}", file=log)
        for used in (base, full):
            os.utime(used)
        _prune(root, True, base.name)
        _prune(root, False, full.name)
        return describe(archive)


def export(image: ImageArchive, output: Path) -> ImageArchive:
    """A copy of the archive at `output` (like build/netclaim-image.tar)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    shutil.copyfile(image.path, partial)
    partial.rename(output)
    return ImageArchive(output, image.reference, image.digest, image.size_bytes, image.layer_sizes)
