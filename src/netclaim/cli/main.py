"""The `netclaim` command: the node agent, the controller, and the commands for the people who run them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from netclaim.core.config import strict
from netclaim.core.config.settings import (
    CNI_BIN_DIRS,
    FALSE,
    TRUE,
    AgentSettings,
    ControllerSettings,
    from_text,
    settings_of,
)
from netclaim.core.names import DRIVER_DOMAIN
from netclaim.core.quantity import format_quantity
from netclaim.errors import ConfigError, NetclaimError


def _agent(args: argparse.Namespace) -> int:
    import asyncio

    from netclaim.agent import main as agent
    from netclaim.core.config.settings import FIELDS, load_settings
    from netclaim.runtime import logs

    flags = {name: getattr(args, name) for name in FIELDS if getattr(args, name, None) is not None}
    settings = load_settings(flags, args.config)
    logs.configure(settings.log_level)
    asyncio.run(agent.run(settings))
    return 0


def _controller(args: argparse.Namespace) -> int:
    import asyncio

    from netclaim.controller import main as controller
    from netclaim.runtime import logs

    flags = {
        s.name: getattr(args, s.name)
        for s in settings_of(ControllerSettings)
        if getattr(args, s.name, None) is not None
    }
    settings = strict.decode(ControllerSettings, flags, "controller settings")
    logs.configure(settings.log_level)
    asyncio.run(controller.run(settings))
    return 0


def _state(args: argparse.Namespace) -> int:
    from netclaim.cli.state import render

    print(render(args.state_dir, args.output))
    return 0


def _inventory(args: argparse.Namespace) -> int:
    import asyncio

    from netclaim.adapters import netlink
    from netclaim.agent.publish.inventory import FileInventory, NodeInventory
    from netclaim.core.devices.catalog import BANDWIDTH, decide
    from netclaim.core.devices.nic import InventorySource
    from netclaim.core.devices.rules import load_policy

    policy = load_policy(args.policy_file)
    source: InventorySource = (
        FileInventory(args.inventory_file)
        if args.inventory_file
        else NodeInventory(netlink, args.nic_overrides, args.cni_conf_dir)
    )
    decisions = decide(asyncio.run(source.scan()), policy, args.driver_name)
    if args.output == "yaml":
        import yaml

        print(
            yaml.safe_dump(
                {
                    "devices": [d.device.to_api() for d in decisions if d.device],
                    "notPublished": {d.interface.name: d.reason for d in decisions if not d.device},
                },
                sort_keys=False,
            ),
            end="",
        )
        return 0
    rows = [("INTERFACE", "DEVICE", "MODE", "BANDWIDTH", "PCI", "NUMA", "DECISION")]
    for decision in decisions:
        device, interface = decision.device, decision.interface
        bandwidth = device.capacity.get(BANDWIDTH) if device else None
        rows.append(
            (
                interface.name,
                device.name if device else "-",
                ("shared" if device.shared else "exclusive") if device else "-",
                format_quantity(bandwidth.value) if bandwidth else "-",
                interface.pci_address or "-",
                str(interface.numa_node) if interface.numa_node is not None else "-",
                decision.reason,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _migrate(args: argparse.Namespace) -> int:
    import tempfile

    import yaml

    from netclaim.cli.migrate import migrate, nad_networks
    from netclaim.core.config.validate import validate_files

    named = nad_networks(args.network)
    documents: list[dict[str, Any]] = []
    for path in args.files:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
        for document in yaml.safe_load_all(text):
            if isinstance(document, dict) and document.get("kind", "").endswith("List"):
                documents += [d for d in document.get("items") or [] if isinstance(d, dict)]
            elif isinstance(document, dict):
                documents.append(document)
    migration = migrate(documents, named)
    output = yaml.safe_dump_all(migration.objects, sort_keys=False)
    with tempfile.TemporaryDirectory() as scratch:
        written = Path(scratch) / "migrated.yaml"
        written.write_text(output)
        problems = [line.replace(str(written), "migrated") for line in validate_files([written]).problems]
    if args.output_file is not None:
        args.output_file.write_text(output)
    else:
        print(output, end="")
    for note in migration.notes:
        print(f"# note: {note}", file=sys.stderr)
    for item in migration.unmapped:
        print(f"# not migrated: {item}", file=sys.stderr)
    for problem in problems:
        print(f"# validate: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _snapshot(args: argparse.Namespace) -> Any:
    import asyncio

    from netclaim.cli.read import read_snapshot

    snapshot = asyncio.run(read_snapshot(args.kubeconfig, args.namespace))
    for what in snapshot.unreadable:
        print(f"netclaim: could not read {what} (RBAC): what follows may be incomplete", file=sys.stderr)
    return snapshot


def _print_data(data: Any, output: str) -> None:
    if output == "json":
        print(json.dumps(data, indent=2))
    else:
        import yaml

        print(yaml.safe_dump(data, sort_keys=False), end="")


def _explain(args: argparse.Namespace) -> int:
    from netclaim.cli import explain, report

    snapshot = _snapshot(args)
    if args.target is None:
        rows = explain.table(snapshot)
        if args.output == "table":
            print(report.render_table(rows, report.use_color(sys.stdout)), end="")
        else:
            _print_data(rows, args.output)
        return 0
    kind, _, name = args.target.partition("/")
    if kind not in ("pod", "pods", "po", "claim", "resourceclaim") or not name:
        raise ConfigError(f"{args.target!r}: expected pod/NAME or claim/NAME")
    namespace = args.namespace or "default"
    if kind.startswith("p"):
        pod = next((p for p in snapshot.pods if (p.namespace, p.name) == (namespace, name)), None)
        if pod is None:
            raise ConfigError(f"pod {namespace}/{name} not found")
        found = [explain.explain_pod(pod, snapshot)]
    else:
        if not any(
            (c["metadata"]["namespace"], c["metadata"]["name"]) == (namespace, name) for c in snapshot.claims
        ):
            raise ConfigError(f"claim {namespace}/{name} not found")
        found = explain.explain_claim(namespace, name, snapshot)
    if args.output != "table":
        _print_data([f.as_data() for f in found], args.output)
        return 0
    for item in found:
        print(f"pod {item.pod}: {item.state}{f' on {item.node}' if item.node else ''}")
        for line in item.lines:
            print(f"  {line}")
        for fix in item.fixes:
            print(f"  fix: {fix}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from netclaim.cli import report

    snapshot = _snapshot(args)
    data = {"pods": report.status_rows(snapshot), "nics": report.nic_rows(snapshot)}
    if args.output != "table":
        _print_data(data, args.output)
        return 0
    color = report.use_color(sys.stdout)
    print(f"== Pods and their interfaces ({args.namespace or 'all namespaces'})")
    print(report.render_table(data["pods"], color), end="")
    print("\n== NICs and capacity")
    print(report.render_table(data["nics"], color), end="")
    return 0


def _nics(args: argparse.Namespace) -> int:
    from netclaim.cli import report

    rows = report.nic_rows(_snapshot(args))
    if args.output == "table":
        print(report.render_table(rows, report.use_color(sys.stdout)), end="")
    else:
        _print_data(rows, args.output)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from netclaim.core.config.validate import validate_files
    from netclaim.core.devices.rules import load_policy, sample_attributes

    known = {name for domain in sample_attributes().values() for name in domain}
    for rule in load_policy(args.policy_file).rules:
        known |= {key.rpartition("/")[2] for key in rule.attributes}
    report = validate_files(list(args.files), frozenset(known))
    for line in report.problems:
        print(line)
    for path in report.unchecked:
        print(f"{path}: nothing netclaim can check (no netclaim.dev config, IPPool or pod with claims)")
    if not report.problems:
        checked = len(args.files) - len(report.unchecked)
        print(f"{checked} of {len(args.files)} file(s) checked: no problems")
    return 1 if report.problems else 0


def _preflight(args: argparse.Namespace) -> int:
    import asyncio
    import os

    from netclaim.adapters import netlink, nftables, nri, tc
    from netclaim.adapters.kube.connection import KubeConnection
    from netclaim.adapters.kube.preflight import KubePreflight
    from netclaim.agent.pods.guard import skeleton
    from netclaim.cli import preflight

    async def port_security() -> None:
        """The kernel takes a NIC's table (nftables' netdev egress hook: Linux 5.16 or later), checked on
        the loopback device and committed nowhere, and tc is installed (its mirred action is probed with
        bandwidth caps)."""
        await nftables.define("", skeleton("lo"), check_only=True)
        await tc.version()

    node = args.node_name or os.environ.get("NODE_NAME", "")
    if args.api and not node:
        raise ConfigError("--node-name: required (or $NODE_NAME) to check this node's token and slice")
    plugins = tuple(p for p in args.plugins.split(",") if p)
    searched = tuple(Path(d) for d in args.cni_bin_dir.split(":") if d)
    paths = preflight.NodePaths(args.nri_socket, args.cdi_spec_dir, searched, plugins)

    async def checked() -> list[preflight.Finding]:
        findings = await preflight.node_findings(paths, nri.reachable, netlink.probe_shaping, port_security)
        if args.api:
            connection = KubeConnection.connect(args.kubeconfig, args.driver_name)
            try:
                findings += await preflight.api_findings(KubePreflight(connection), node, args.driver_name)
            finally:
                await connection.close()
        return findings

    findings = asyncio.run(checked())
    print(preflight.render(findings), end="")
    return 1 if any(f.severity == "fail" for f in findings) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="netclaim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    agent = commands.add_parser("agent", help="the node agent (publish, kubelet plugin, NRI hooks)")
    agent.add_argument("--config", type=Path, help="YAML file of settings (flags and NETCLAIM_* win)")
    _settings_flags(agent, AgentSettings)
    agent.set_defaults(handler=_agent)
    control = commands.add_parser(
        "controller", help="the cluster's controller (IP pools, addresses, Services, network policies)"
    )
    _settings_flags(control, ControllerSettings)
    control.set_defaults(handler=_controller)

    _add_tools(commands)

    check = commands.add_parser(
        "preflight",
        help="what the agent needs of this node and the cluster, checked (exit 1: a check failed)",
    )
    check.add_argument("--node-name", help="this node (default $NODE_NAME)")
    check.add_argument("--kubeconfig", type=Path, help="default: in-cluster ServiceAccount, else $KUBECONFIG")
    check.add_argument("--driver-name", default=DRIVER_DOMAIN)
    check.add_argument("--nri-socket", type=Path, default=Path("/var/run/nri/nri.sock"))
    check.add_argument("--cdi-spec-dir", type=Path, default=Path("/var/run/cdi"))
    check.add_argument(
        "--cni-bin-dir",
        default=CNI_BIN_DIRS,
        help="the directories searched for the plugins, DIR:DIR as the agent's (default %(default)s)",
    )
    check.add_argument(
        "--plugins",
        default=",".join(("macvlan", "host-device", "static")),
        help="CNI plugins that must be installed, comma-separated (default: those the agent itself runs)",
    )
    check.add_argument("--api", type=_flag, default=True, help="also check the token and the API's gates")
    check.set_defaults(handler=_preflight)

    inventory = commands.add_parser("inventory", help="what the agent would publish on this node")
    inventory.add_argument("-o", "--output", choices=["table", "yaml"], default="table")
    inventory.add_argument("--policy-file", type=Path)
    inventory.add_argument("--nic-overrides", type=Path)
    inventory.add_argument("--cni-conf-dir", type=Path, default=Path("/etc/cni/net.d"))
    inventory.add_argument("--inventory-file", type=Path)
    inventory.add_argument("--driver-name", default=DRIVER_DOMAIN)
    inventory.set_defaults(handler=_inventory)

    state = commands.add_parser(
        "state", help="this node's persisted attachments, read-only beside the running agent (in its pod)"
    )
    state.add_argument("--state-dir", type=Path, default=Path("/var/lib/netclaim"), help="the agent's")
    state.add_argument("-o", "--output", choices=["table", "json"], default="table")
    state.set_defaults(handler=_state)
    return parser


def _add_tools(commands: Any) -> None:
    """The commands for the people who run netclaim; also `kubectl netclaim ...` (kubectl_main)."""

    def reading(name: str, help_text: str) -> argparse.ArgumentParser:
        command: argparse.ArgumentParser = commands.add_parser(name, help=help_text)
        command.add_argument("-n", "--namespace", help="default: every namespace (explain TARGET: default)")
        command.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG, else ~/.kube/config")
        command.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
        return command

    explain = reading("explain", "why a pod's or claim's devices do or do not fit, per node and device")
    explain.add_argument("target", nargs="?", help="pod/NAME or claim/NAME; none: a row per pod with claims")
    explain.set_defaults(handler=_explain)
    reading("status", "pods -> claims -> devices -> interfaces, IPs, bandwidth").set_defaults(handler=_status)
    reading("nics", "per node: devices, capacity used and free").set_defaults(handler=_nics)
    migrate = commands.add_parser(
        "migrate", help="Multus NetworkAttachmentDefinitions and annotated workloads to DRA objects"
    )
    migrate.add_argument(
        "files", nargs="+", type=Path, help="YAML files; - reads `kubectl get -o yaml` from stdin"
    )
    migrate.add_argument("--output-file", type=Path, help="write the objects here (default: standard output)")
    migrate.add_argument(
        "--network",
        action="append",
        default=[],
        metavar="NAMESPACE/NAD=NETWORK",
        help="the netclaim network (a NIC's netclaim.dev/network) of a NAD that MultiNetworkPolicies name "
        "(default: NAMESPACE-NAD); repeat for several",
    )
    migrate.set_defaults(handler=_migrate)
    validate = commands.add_parser("validate", help="check claims, templates and DeviceClasses offline")
    validate.add_argument("files", nargs="+", type=Path)
    validate.add_argument(
        "--policy-file", type=Path, help="the PublishPolicy whose attributes placeholders may also name"
    )
    validate.set_defaults(handler=_validate)


def _settings_flags(command: argparse.ArgumentParser, model: type[msgspec.Struct]) -> None:
    """A flag per setting (--kebab-case), read as the field's type reads text and helped by its description:
    the flags are the settings, never a second list of them."""
    for setting in settings_of(model):
        flag = f"--{setting.name.replace('_', '-')}"
        shown = "" if setting.default in (None, "") else f" (default {setting.default})"

        def read(text: str, name: str = setting.name, flag: str = flag) -> object:
            try:
                return from_text(model, name, text, flag)
            except ConfigError as err:
                raise argparse.ArgumentTypeError(str(err)) from None

        command.add_argument(flag, type=read, help=f"{setting.description}{shown}")


def _flag(text: str) -> bool:
    if text.lower() in TRUE:
        return True
    if text.lower() in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except NetclaimError as err:
        print(f"netclaim: {err}", file=sys.stderr)
        return 2


def kubectl_main(argv: list[str] | None = None) -> int:
    """`kubectl netclaim ...`: kubectl runs `kubectl-netclaim` from PATH with the arguments after its name."""
    parser = argparse.ArgumentParser(prog="kubectl netclaim", description="netclaim for kubectl users")
    _add_tools(parser.add_subparsers(required=True, metavar="{explain,status,nics,migrate,validate}"))
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except NetclaimError as err:
        print(f"kubectl netclaim: {err}", file=sys.stderr)
        return 2
