"""Build the pinned real programs of the local cluster from the Go module proxy, once per pin set.

The pins live in `tools/k8s/*/go.mod` (+ go.sum). The cache directory is named after a hash of
those files, the Go version and the build flags, so a change of any pin builds afresh and an
unchanged tree reuses the programs: `~/.cache/netclaim/bin/<hash>/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from netclaim.errors import PrerequisiteError
from netclaim_lab.layout import REPO_ROOT

PROGRAMS = (
    "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl",
    "containerd", "containerd-shim-runc-v2", "ctr", "crictl", "etcd", "pause",
    "whereabouts", "whereabouts-reconcile", "helm", "dra-example-kubeletplugin",
)  # fmt: skip
# The local cluster's agents run these CNI plugins beside the node's set (node.install_cni_plugins).
CNI_PLUGINS = ("whereabouts",)
# containernetworking/plugins, the reference set of the CNI project (spec 1.1 from v1.10: STATUS, GC), as
# Debian ships it: the local cluster's default plugins (Debian's 1.0-level build stays a tested choice)
REFERENCE_CNI_PLUGINS = (
    "main/bridge", "main/host-device", "main/ipvlan", "main/loopback", "main/macvlan", "main/ptp",
    "main/vlan", "ipam/host-local", "ipam/static", "ipam/dhcp",
    "meta/bandwidth", "meta/firewall", "meta/portmap", "meta/sbr", "meta/tuning", "meta/vrf",
)  # fmt: skip


@dataclass(frozen=True)
class GoBuild:
    module_dir: str
    packages: tuple[str, ...]
    pinned_module: str
    version_flags: tuple[str, ...] = ()
    tags: str = ""
    # (built as, installed as): a program whose package's last path element is not its name
    renames: tuple[tuple[str, str], ...] = ()


_BUILDS = (
    GoBuild(
        "kubernetes",
        tuple(f"k8s.io/kubernetes/cmd/{p}" for p in PROGRAMS[:5]),
        "k8s.io/kubernetes",
        (
            "k8s.io/component-base/version.gitVersion={version}",
            "k8s.io/component-base/version.gitMajor={major}",
            "k8s.io/component-base/version.gitMinor={minor}",
            "k8s.io/component-base/version.gitTreeState=clean",
            "k8s.io/client-go/pkg/version.gitVersion={version}",
        ),
    ),
    GoBuild(
        "containerd",
        tuple(f"github.com/containerd/containerd/v2/cmd/{p}" for p in PROGRAMS[5:8]),
        "github.com/containerd/containerd/v2",
        ("github.com/containerd/containerd/v2/version.Version={version}",),
        tags="no_btrfs no_devmapper no_zfs",
    ),
    GoBuild(
        "crictl",
        ("sigs.k8s.io/cri-tools/cmd/crictl",),
        "sigs.k8s.io/cri-tools",
        ("sigs.k8s.io/cri-tools/pkg/version.Version={version}",),
    ),
    GoBuild("etcd", (".",), "go.etcd.io/etcd/server/v3"),
    GoBuild("pause", (".",), ""),
    # whereabouts' CNI plugin (its main package is .../cmd) and our one-pass reconciler around its library:
    # the incumbent cluster-wide IPAM, for tests/cluster/test_ipam_comparison.py
    GoBuild(
        "whereabouts",
        ("github.com/k8snetworkplumbingwg/whereabouts/cmd", "./whereabouts-reconcile"),
        "github.com/k8snetworkplumbingwg/whereabouts",
        (
            "github.com/k8snetworkplumbingwg/whereabouts/pkg/version.Version={version}",
            "github.com/k8snetworkplumbingwg/whereabouts/pkg/version.GitTreeState=clean",
            "github.com/k8snetworkplumbingwg/whereabouts/pkg/version.ReleaseStatus=released",
        ),
        renames=(("cmd", "whereabouts"),),
    ),
    # helm renders charts/netclaim (tests/test_helm_chart.py). As helm's own Makefile: its version, and the
    # Kubernetes version of its client-go as the default of .Capabilities.KubeVersion and of lint's checks
    # (v1.20 otherwise, below the chart's kubeVersion)
    GoBuild(
        "helm",
        ("helm.sh/helm/v3/cmd/helm",),
        "helm.sh/helm/v3",
        (
            "helm.sh/helm/v3/internal/version.version={version}",
            "helm.sh/helm/v3/internal/version.gitTreeState=clean",
            "helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
            "helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={client_go_minor}",
            "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
            "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={client_go_minor}",
        ),
    ),
    # Kubernetes' example DRA driver: make bench's second driver, whose claims cost what DRA itself costs
    # (netclaim_lab.example_driver). Its kubelet plugin only: its Makefile's `-X main.version` names no
    # variable of that program.
    GoBuild(
        "dra-example-driver",
        ("sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin",),
        "sigs.k8s.io/dra-example-driver",
    ),
)


# The Kubernetes and containerd minor versions of the programs (tools/k8s/kubernetes, tools/k8s/containerd);
# the others a cluster file may ask for (make test-matrix) are pinned in tools/k8s/kubernetes-1.N and
# tools/k8s/containerd-N.M, each built apart, only when asked for
KUBERNETES = "1.37"
KUBERNETES_PROGRAMS = PROGRAMS[:5]
CONTAINERD = "2.4"
CONTAINERD_PROGRAMS = PROGRAMS[5:8]


def _versioned_build(own: GoBuild, version: str) -> GoBuild:
    """`own` (one of _BUILDS), from the module that pins `version` instead: tools/k8s/<own>-<version>."""
    return dataclasses.replace(own, module_dir=f"{own.module_dir}-{version}")


def _kubernetes_build(version: str) -> GoBuild:
    return _versioned_build(_BUILDS[0], version)


def _containerd_build(version: str) -> GoBuild:
    if version.startswith("1."):
        # containerd 1.x: the module before /v2, its version variable in the same place
        return GoBuild(
            f"containerd-{version}",
            tuple(f"github.com/containerd/containerd/cmd/{p}" for p in CONTAINERD_PROGRAMS),
            "github.com/containerd/containerd",
            ("github.com/containerd/containerd/version.Version={version}",),
            tags=_BUILDS[1].tags,
        )
    return _versioned_build(_BUILDS[1], version)


# CRI-O, the other node runtime (make test-matrix; `runtime: crio` in a cluster file): its daemon and
# crio-import (tools/k8s/crio-N.M/crio-import: the lab's OCI archives into its storage, as `ctr images
# import` does for containerd), with CRI-O's own build tags (no gpgme, ostree, btrfs or devicemapper: none
# links without cgo), and pinns, the C helper that pins a pod's namespaces, compiled from the same module's
# source. Built apart, into ~/.cache/netclaim/crio/<hash>/; conmon and runc are Debian's.
CRIO = "1.36"
CRIO_PROGRAMS = ("crio", "crio-import", "pinns")
_CRIO_TAGS = (
    "containers_image_openpgp containers_image_ostree_stub exclude_graphdriver_btrfs "
    "exclude_graphdriver_devicemapper btrfs_noversion"
)
# a static pinns (no libc of this machine needed inside a node), as CRI-O's own pinns Makefile builds it
_PINNS_BUILD = ("gcc", "-std=c99", "-Os", "-Wall", "-static")


def _crio_build(version: str) -> GoBuild:
    return GoBuild(
        f"crio-{version}",
        ("github.com/cri-o/cri-o/cmd/crio", "./crio-import"),
        "github.com/cri-o/cri-o",
        tags=_CRIO_TAGS,
    )


_REFERENCE_CNI_NAMES = tuple(p.rsplit("/", 1)[1] for p in REFERENCE_CNI_PLUGINS)
# built apart from _BUILDS, into a directory of its own: a plugin pin change rebuilds the plugins alone
_REFERENCE_CNI = GoBuild(
    "cni-plugins",
    tuple(f"github.com/containernetworking/plugins/plugins/{p}" for p in REFERENCE_CNI_PLUGINS),
    "github.com/containernetworking/plugins",
    ("github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion={version}",),
)


# Prometheus' promtool checks and tests the chart's alerting rules (tests/test_monitoring.py); apart from the
# programs, like the plugins. Without service discovery (remove_all_sd): a rule check reads no targets.
_PROMTOOL = GoBuild(
    "promtool",
    ("github.com/prometheus/prometheus/cmd/promtool",),
    "github.com/prometheus/prometheus",
    ("github.com/prometheus/common/version.Version={version}",),
    tags="remove_all_sd",
)


def tools_dir() -> Path:
    """`tools/k8s` of the checkout this package runs from (or NETCLAIM_TOOLS_DIR)."""
    override = os.environ.get("NETCLAIM_TOOLS_DIR")
    path = Path(override) if override else REPO_ROOT / "tools" / "k8s"
    if not (path / "kubernetes" / "go.mod").is_file():
        raise PrerequisiteError(f"{path}: the pinned Go modules are missing; run from a netclaim checkout")
    return path


def cache_root() -> Path:
    return Path(os.environ.get("NETCLAIM_CACHE", Path.home() / ".cache" / "netclaim"))


def _go_version() -> str:
    go = shutil.which("go")
    if not go:
        raise PrerequisiteError("the Go toolchain is missing: install Go ≥ 1.26 (https://go.dev/dl) on PATH")
    return subprocess.run([go, "env", "GOVERSION"], check=True, capture_output=True, text=True).stdout.strip()


def pins_hash(tools: Path, builds: tuple[GoBuild, ...] = _BUILDS) -> str:
    digest, modules = hashlib.sha256(), {build.module_dir for build in builds}
    for path in sorted(tools.rglob("*")):
        pinned = path.name in {"go.mod", "go.sum"} or path.suffix == ".go"
        if path.is_file() and pinned and path.relative_to(tools).parts[0] in modules:
            digest.update(str(path.relative_to(tools)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(_go_version().encode())
    digest.update(repr(builds).encode())
    return digest.hexdigest()[:16]


def pinned_version(go_mod: Path, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.MULTILINE)
    if not match:
        raise PrerequisiteError(f"{go_mod}: no pinned version of {module}")
    return match.group(1)


def module_source(pins: str, module: str) -> Path:
    """The source of `module` as the Go module proxy served it for tools/k8s/`pins`' pin (downloaded into
    the module cache if missing; go.sum checks it): charts and CRDs that ship with a pinned program."""
    directory = tools_dir() / pins
    found = subprocess.run(
        ["go", "mod", "download", "-json", module],
        cwd=directory,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GOFLAGS": "-mod=readonly"},
    )
    if found.returncode != 0:
        raise PrerequisiteError(
            f"go mod download {module} in {directory} failed: it needs Go >= 1.26 and the module proxy (or "
            f"the module already in GOMODCACHE). go said:\n{found.stdout[-2000:]}{found.stderr[-2000:]}"
        )
    return Path(json.loads(found.stdout)["Dir"])


def bin_dir() -> Path:
    """Where the programs of the current pins are; it exists only once they are built."""
    tools = tools_dir()
    return cache_root() / "bin" / pins_hash(tools)


def reference_cni_dir() -> Path:
    """Where the reference CNI plugins of the current pin are; it exists only once they are built."""
    return cache_root() / "cni-plugins" / pins_hash(tools_dir(), (_REFERENCE_CNI,))


def promtool_dir() -> Path:
    """Where promtool of the current pin is; it exists only once it is built."""
    return cache_root() / "promtool" / pins_hash(tools_dir(), (_PROMTOOL,))


def _built(directory: Path, names: tuple[str, ...], what: str) -> Path:
    missing = [n for n in names if not (directory / n).is_file()]
    if missing:
        raise PrerequisiteError(
            f"the {what} are not built ({', '.join(missing)} missing in {directory}): run `make bins`"
        )
    return directory


def built_reference_cni_dir() -> Path:
    return _built(reference_cni_dir(), _REFERENCE_CNI_NAMES, "reference CNI plugins")


def built_bin_dir() -> Path:
    return _built(bin_dir(), PROGRAMS, "cluster programs")


def built_promtool() -> Path:
    return _built(promtool_dir(), ("promtool",), "promtool") / "promtool"


def kubernetes_dir(version: str) -> Path:
    """Where the Kubernetes programs of `version` (not the default) are; it exists once they are built."""
    return cache_root() / "kubernetes" / pins_hash(tools_dir(), (_kubernetes_build(version),))


def containerd_dir(version: str) -> Path:
    """Where containerd `version`'s programs (not the default's) are; it exists once they are built."""
    return cache_root() / "containerd" / pins_hash(tools_dir(), (_containerd_build(version),))


def crio_dir(version: str = CRIO) -> Path:
    """Where CRI-O `version`'s programs are; it exists once they are built."""
    recipe = pins_hash(tools_dir(), (_crio_build(version),)) + " ".join(_PINNS_BUILD)
    return cache_root() / "crio" / hashlib.sha256(recipe.encode()).hexdigest()[:16]


def built_crio_dir(version: str = CRIO) -> Path:
    return _built(crio_dir(version), CRIO_PROGRAMS, f"CRI-O {version} programs")


def build_crio(version: str = CRIO, log: TextIO = sys.stderr) -> None:
    """CRI-O `version`'s daemon, crio-import and pinns (make test-matrix), apart from the programs."""
    step, target = _crio_build(version), crio_dir(version)
    if not shutil.which("gcc"):
        raise PrerequisiteError("gcc is missing (CRI-O's pinns is C): apt-get install gcc libc6-dev")
    with build_lock(target.parent):
        if all((target / n).is_file() for n in CRIO_PROGRAMS):
            print(f"CRI-O {version} up to date in {target}", file=log)
            return
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        _go_build(step, staging, log)
        sources = sorted((module_source(step.module_dir, step.pinned_module) / "pinns" / "src").glob("*.c"))
        pinns = subprocess.run(
            [*_PINNS_BUILD, "-o", str(staging / "pinns"), *map(str, sources)],
            capture_output=True,
            text=True,
            check=False,
        )
        if pinns.returncode != 0:
            raise PrerequisiteError(
                f"building CRI-O's pinns failed (static: it needs gcc and libc6-dev): {pinns.stderr[-2000:]}"
            )
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)


def build_kubernetes(version: str, log: TextIO = sys.stderr) -> None:
    """Kubernetes `version`'s programs (make test-matrix), apart from the default pin set."""
    if version != KUBERNETES:
        names = KUBERNETES_PROGRAMS
        _build_apart(_kubernetes_build(version), kubernetes_dir(version), names, f"Kubernetes {version}", log)


def build_containerd(version: str, log: TextIO = sys.stderr) -> None:
    """containerd `version`'s programs (make test-matrix), apart from the default pin set."""
    if version != CONTAINERD:
        names = CONTAINERD_PROGRAMS
        _build_apart(_containerd_build(version), containerd_dir(version), names, f"containerd {version}", log)


def cluster_bin_dir(kubernetes: str = KUBERNETES, containerd: str = CONTAINERD) -> Path:
    """The programs of a cluster running Kubernetes `kubernetes` and containerd `containerd`: the pinned
    ones, with that version's kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl,
    and containerd, its shim and ctr, in place of the default's (a directory of links, made once per
    combination of pin sets)."""
    programs = built_bin_dir()
    replaced: dict[str, Path] = {}
    if kubernetes != KUBERNETES:
        built = _built(kubernetes_dir(kubernetes), KUBERNETES_PROGRAMS, f"Kubernetes {kubernetes} programs")
        replaced.update(dict.fromkeys(KUBERNETES_PROGRAMS, built))
    if containerd != CONTAINERD:
        built = _built(containerd_dir(containerd), CONTAINERD_PROGRAMS, f"containerd {containerd} programs")
        replaced.update(dict.fromkeys(CONTAINERD_PROGRAMS, built))
    if not replaced:
        return programs
    sources = sorted({d.name for d in replaced.values()})
    merged = cache_root() / "matrix" / "-".join([kubernetes, containerd, programs.name, *sources])
    if not merged.is_dir():
        staging = merged.with_name(merged.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for program in programs.iterdir():
            (staging / program.name).symlink_to(replaced.get(program.name, programs) / program.name)
        staging.rename(merged)
    return merged


@contextlib.contextmanager
def build_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(log: TextIO = sys.stderr) -> Path:
    """Build every pinned program and the reference CNI plugins unless this pin set is already in the
    cache; return the programs' directory."""
    target = _build_programs(log)
    _build_apart(_REFERENCE_CNI, reference_cni_dir(), _REFERENCE_CNI_NAMES, "reference CNI plugins", log)
    _build_apart(_PROMTOOL, promtool_dir(), ("promtool",), "promtool", log)
    return target


def _build_programs(log: TextIO) -> Path:
    target = bin_dir()
    with build_lock(target.parent):
        if all((target / p).is_file() for p in PROGRAMS):
            print(f"cluster programs up to date in {target}", file=log)
            return target
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        started = time.monotonic()
        print("building the pinned cluster programs (cold caches: ~15 min on 2 cores)", file=log, flush=True)
        for step in _BUILDS:
            _go_build(step, staging, log)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        minutes = (time.monotonic() - started) / 60
        print(f"built {len(PROGRAMS)} programs in {minutes:.1f} min into {target}", file=log)
        return target


def _build_apart(step: GoBuild, target: Path, names: tuple[str, ...], what: str, log: TextIO) -> None:
    """A build with a cache directory of its own: a change of its pin rebuilds it alone."""
    with build_lock(target.parent):
        if all((target / n).is_file() for n in names):
            print(f"{what} up to date in {target}", file=log)
            return
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        _go_build(step, staging, log)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)


def _go_build(step: GoBuild, output: Path, log: TextIO) -> None:
    module_dir = tools_dir() / step.module_dir
    flags: list[str] = ["-s", "-w"]
    if step.pinned_module:
        version = pinned_version(module_dir / "go.mod", step.pinned_module)
        major, minor = version.lstrip("v").split(".")[:2]
        fields = {"version": version, "major": major, "minor": minor}
        if any("{client_go_minor}" in flag for flag in step.version_flags):
            client_go = pinned_version(module_dir / "go.mod", "k8s.io/client-go")
            fields["client_go_minor"] = client_go.split(".")[1]  # client-go v0.N goes with Kubernetes 1.N
        for flag in step.version_flags:
            flags += ["-X", flag.format(**fields)]
    command = ["go", "build", "-mod=readonly", "-trimpath", "-ldflags", " ".join(flags), "-o", f"{output}/"]
    if step.tags:
        command += ["-tags", step.tags]
    command += list(step.packages)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
    started = time.monotonic()
    print(f"building {step.module_dir}...", file=log, flush=True)
    result = subprocess.run(command, cwd=module_dir, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PrerequisiteError(
            f"go build in {module_dir} failed ({' '.join(step.packages)}). It needs Go ≥ 1.26 on PATH "
            "(https://go.dev/dl) and the Go module proxy reachable (GOPROXY, or the modules already in "
            f"GOMODCACHE); the pins are {module_dir / 'go.mod'} and go.sum. go said:\n{result.stderr[-4000:]}"
        )
    for built, name in step.renames:
        (output / built).rename(output / name)
    print(f"  {step.module_dir}: {time.monotonic() - started:.0f} s", file=log, flush=True)
