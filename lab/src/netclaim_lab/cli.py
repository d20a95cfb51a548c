"""The `netclaim-lab` command: a real local cluster, the agent image and the demo, from a checkout."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from netclaim.errors import NetclaimError

DEFAULT_CLUSTER_FILE = Path("examples/demo/cluster.yaml")
DEFAULT_IMAGE_ARCHIVE = Path("build/netclaim-image.tar")


def _cluster_name(args: argparse.Namespace) -> str:
    if args.name:
        return str(args.name)
    from netclaim_lab.spec import load_cluster_spec

    return load_cluster_spec(args.file).name


def _cluster(args: argparse.Namespace) -> int:
    from netclaim_lab import binaries, cluster

    if args.action == "build":
        binaries.build()
        for version in args.kubernetes or ():
            binaries.build_kubernetes(version)
        for version in args.containerd or ():
            binaries.build_containerd(version)
        for version in args.crio or ():
            binaries.build_crio(version)
    elif args.action == "image":
        return _image(args)
    elif args.action == "up":
        cluster.up(args.file)
    elif args.action == "down":
        cluster.down(_cluster_name(args))
    elif args.action == "status":
        report = cluster.status(_cluster_name(args))
        print(json.dumps(report, indent=2))
        return 0 if report["up"] else 1
    elif args.action == "keep-nodes":
        from netclaim_lab.keeper import keep_nodes

        keep_nodes(_cluster_name(args))
    return 0


def _image(args: argparse.Namespace) -> int:
    from netclaim_lab import agent_image

    if args.relock:
        agent_image.relock()
        return 0
    if args.containerfile:
        from netclaim_lab import containerfile

        built = containerfile.build(args.tag or agent_image.DEFAULT_REF)
    else:
        built = agent_image.ensure(args.tag or agent_image.DEFAULT_REF, arch=args.arch, rebuild=args.rebuild)
    image = agent_image.export(built, args.output)
    mib = 1024 * 1024
    layers = " + ".join(f"{size / mib:.1f}" for size in image.layer_sizes)
    print(
        f"image {image.reference} digest {image.digest} size {image.size_bytes / mib:.1f} MiB "
        f"(layers {layers} MiB uncompressed) in {image.path}"
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    import time

    from netclaim_lab import agent_image, agents, cluster, demo

    started = time.monotonic()
    handle = cluster.up(args.file)
    print(
        f"[{time.monotonic() - started:5.1f}s] deploying netclaim: CRDs, RBAC, DeviceClasses, policy, "
        "the controller, agents"
    )
    agents.deploy(handle, demo.POLICY, image=agent_image.describe(args.image) if args.image else None)
    print(
        f"[{time.monotonic() - started:5.1f}s] the demo: Pod-A asks 10Gi, Deployment-B 3 x {args.b_request}"
    )
    code = 0
    try:
        demo.run(handle, b_request=args.b_request)
        print(f"\nThe demo behaved as expected (total {time.monotonic() - started:.1f} s).")
    except demo.ExpectationError as err:
        print(f"\n{err}")
        code = 1
    print(f"""
Look around:
  export KUBECONFIG={handle.kubeconfig} PATH={handle.bin_dir}:$PATH
  kubectl get resourceslices,resourceclaims -A -o wide
  kubectl get ippools,ipallocations
  kubectl -n {demo.NAMESPACE} get pods -o wide
  kubectl -n {demo.NAMESPACE} exec pod-a -- ip a show net1
Tear down:
  make demo-down        (or: .venv/bin/netclaim-lab cluster down {handle.spec.name})""")
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="netclaim-lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    cluster = commands.add_parser("cluster", help="a real local Kubernetes cluster with declared NICs")
    cluster.add_argument("action", choices=["build", "image", "up", "down", "status", "keep-nodes"])
    cluster.add_argument("name", nargs="?", help="cluster name (down/status; default: from --file)")
    cluster.add_argument(
        "-f",
        "--file",
        type=Path,
        default=DEFAULT_CLUSTER_FILE,
        help=f"cluster file (default {DEFAULT_CLUSTER_FILE})",
    )
    cluster.add_argument(
        "--kubernetes",
        action="append",
        choices=["1.34", "1.35", "1.36"],
        help="build: also this Kubernetes minor version's programs (make test-matrix); repeatable",
    )
    cluster.add_argument(
        "--containerd",
        action="append",
        choices=["1.7", "2.0", "2.2"],
        help="build: also this containerd minor version's programs (make test-matrix); repeatable",
    )
    cluster.add_argument(
        "--crio",
        action="append",
        choices=["1.36"],
        help="build: also CRI-O's programs (crio, crio-import, pinns; make test-matrix)",
    )
    image = cluster.add_argument_group("image", "the agent's container image, built without an engine")
    image.add_argument(
        "--tag", help="its reference (default: deploy/'s, registry.example.com/netclaim:0.1.0)"
    )
    image.add_argument("--output", type=Path, default=DEFAULT_IMAGE_ARCHIVE, help="%(default)s")
    image.add_argument("--rebuild", action="store_true", help="build every layer afresh, cache or not")
    image.add_argument(
        "--relock", action="store_true", help="resolve image/requirements.lock from pyproject.toml"
    )
    image.add_argument(
        "--arch",
        choices=["amd64", "arm64"],
        default="amd64",
        help="the image's architecture (arm64 here runs its programs under qemu-user; default %(default)s)",
    )
    image.add_argument(
        "--containerfile",
        action="store_true",
        help="build the repository's Containerfile with buildah instead (as a user without this lab does)",
    )
    cluster.set_defaults(handler=_cluster)

    demo = commands.add_parser("demo", help="the KubeCon demo on a local cluster, with a report")
    demo.add_argument("-f", "--file", type=Path, default=DEFAULT_CLUSTER_FILE)
    demo.add_argument(
        "--b-request", default="5Gi", help="bandwidth each Deployment-B replica asks (default 5Gi)"
    )
    demo.add_argument(
        "--image",
        type=Path,
        help="an OCI archive of the image to run (default: `make image`'s, built if need be)",
    )
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except NetclaimError as err:
        print(f"netclaim-lab: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(
            f"netclaim-lab: {' '.join(map(str, err.cmd))} exited {err.returncode}: {err.stderr}",
            file=sys.stderr,
        )
        return 1
