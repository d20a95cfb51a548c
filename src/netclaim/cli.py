"""The `netclaim` command: local cluster tooling today; agent, inventory and validate as they land."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from netclaim.errors import NetclaimError

DEFAULT_CLUSTER_FILE = Path("examples/demo/cluster.yaml")


def _cluster_name(args: argparse.Namespace) -> str:
    if args.name:
        return str(args.name)
    from netclaim.cluster.spec import load_cluster_spec

    return load_cluster_spec(args.file).name


def _cluster(args: argparse.Namespace) -> int:
    from netclaim.cluster import binaries, cluster

    if args.action == "build":
        binaries.build()
    elif args.action == "up":
        cluster.up(args.file)
    elif args.action == "down":
        cluster.down(_cluster_name(args))
    elif args.action == "status":
        report = cluster.status(_cluster_name(args))
        print(json.dumps(report, indent=2))
        return 0 if report["up"] else 1
    elif args.action == "keep-nodes":
        from netclaim.cluster.keeper import keep_nodes

        keep_nodes(_cluster_name(args))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="netclaim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    cluster = commands.add_parser("cluster", help="a real local Kubernetes cluster with declared NICs")
    cluster.add_argument("action", choices=["build", "up", "down", "status", "keep-nodes"])
    cluster.add_argument("name", nargs="?", help="cluster name (down/status; default: from --file)")
    cluster.add_argument(
        "-f",
        "--file",
        type=Path,
        default=DEFAULT_CLUSTER_FILE,
        help=f"cluster file (default {DEFAULT_CLUSTER_FILE})",
    )
    cluster.set_defaults(handler=_cluster)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except NetclaimError as err:
        print(f"netclaim: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(
            f"netclaim: {' '.join(map(str, err.cmd))} exited {err.returncode}: {err.stderr}", file=sys.stderr
        )
        return 1
