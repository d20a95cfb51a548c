"""`netclaim migrate`: Multus NetworkAttachmentDefinitions and annotated workloads to DRA objects.

Each NAD becomes a DeviceClass (the admin's half: which NIC, and the NAD's plugin chain as the class's
config, its IPAM kept as it was); each network a workload's pods select (`k8s.v1.cni.cncf.io/networks`)
becomes a ResourceClaimTemplate in the workload's namespace (the pod's half: the interface name, and the
per-pod `ips`, `mac` and `default-route` requests, which restate the chain); the workload is patched to
claim them instead of carrying the annotation. The NIC a NAD names (macvlan/ipvlan `master`, host-device
`device` or `pciBusID`) becomes a CEL selector and `{{ device.ifName }}` in the chain. What has no DRA
equivalent is listed with the reason, never dropped: a NAD whose config lives on the nodes, a plugin the
allow-list refuses, runtime capabilities DRA does not pass (portMappings, infinibandGUID, cni-args).

A MultiNetworkPolicy whose `policy-for` names a migrated NAD also names that NAD's netclaim network,
`netclaim.dev/<namespace>-<name>` unless the admin names one (`--network NAMESPACE/NAD=NETWORK`), beside
the Multus name (so it holds for the pods of either while the workloads roll). A netclaim network is a
NIC's `netclaim.dev/network` attribute, which the admin's publish policy gives: the DeviceClass of a NAD
that a policy names selects only NICs carrying it, so that no migrated pod can land where its policy would
not apply (fail closed), and the notes say which NIC needs which attribute.

Multus gives the pod's interfaces the names net1, net2, ... in the order the annotation lists them;
migrated claims keep those names. Multus does not shape traffic: migrated classes say `bandwidth: none`,
and each claim still consumes its NIC's default bandwidth when it asks for none (docs/config.md).
"""

from __future__ import annotations

import copy
import json
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from netclaim.core.config.cniconfig import as_conflist
from netclaim.core.config.validate import ALLOWED_PLUGINS, POD_SPECS
from netclaim.core.names import API_VERSION, DRIVER_DOMAIN, NETWORK_NAME
from netclaim.core.policy.spec import NETWORK_PREFIX, POLICY_FOR
from netclaim.errors import ConfigError

NETWORKS = "k8s.v1.cni.cncf.io/networks"
RESOURCE_NAME = "k8s.v1.cni.cncf.io/resourceName"
NAD_KIND = "NetworkAttachmentDefinition"
POLICY_KIND = "MultiNetworkPolicy"
UNSUPPORTED_CAPABILITIES = {
    "portMappings": "DRA passes no runtimeConfig: expose the port on the pod's primary network",
    "infinibandGUID": "InfiniBand GUIDs are not set by netclaim",
    "deviceID": "the device is the allocated DRA device, not a runtime capability",
}
SELECTION = re.compile(r"^(?:(?P<namespace>[^/@]+)/)?(?P<name>[^/@]+)(?:@(?P<interface>.+))?$")


@dataclass
class Migration:
    objects: list[dict[str, Any]] = field(default_factory=list)  # what to apply, classes first
    notes: list[str] = field(default_factory=list)  # mapped, with a difference worth knowing
    unmapped: list[str] = field(default_factory=list)  # `KIND/NAME: what: why`


@dataclass(frozen=True)
class Network:
    """A NAD as DRA sees it: its class name, the chain with the NIC as a placeholder, the selector."""

    namespace: str
    name: str
    device_class: str
    chain: dict[str, Any]
    selectors: tuple[str, ...]
    exclusive: bool
    extended_resource: str = ""  # the device plugin's resource the NAD named (resourceName)
    netclaim_network: str = ""  # the NICs' `netclaim.dev/network` its MultiNetworkPolicies need; "": none


def _meta(document: dict[str, Any]) -> tuple[str, str]:
    meta = document.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name", "?"))


def _label(text: str) -> str:
    """A DNS label made of `text` (lower case, other characters as '-', at most 63)."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].rstrip("-") or "net"


ATTRIBUTES = f'device.attributes["{DRIVER_DOMAIN}"]'


def _attribute(name: str, value: str) -> str:
    return f"{ATTRIBUTES}.{name} == {json.dumps(value)}"


def network_of(
    nad: dict[str, Any], migration: Migration, policed: Mapping[tuple[str, str], str] | None = None
) -> Network | None:
    """The NAD as a DRA network, or None (listed in `migration.unmapped`); `policed`: the (namespace,
    name) of the NADs a MultiNetworkPolicy names, and the netclaim network each becomes."""
    namespace, name = _meta(nad)
    where = f"{NAD_KIND}/{namespace}/{name}"
    raw = (nad.get("spec") or {}).get("config")
    if not raw:
        migration.unmapped.append(
            f"{where}: no spec.config: Multus reads it from the nodes' CNI directory; copy it into the NAD"
        )
        return None
    try:
        chain = as_conflist(json.loads(raw))
    except (ValueError, AttributeError) as err:
        migration.unmapped.append(f"{where}: spec.config is not a JSON object ({err})")
        return None
    # "ifName" first: the driver also publishes IP pools, which have no NIC attributes, and a selector
    # reading a missing attribute is a CEL error that fails the whole allocation
    selectors = [f'device.driver == "{DRIVER_DOMAIN}"', f'"ifName" in {ATTRIBUTES}']
    exclusive = False
    for index, plugin in enumerate(chain.get("plugins") or []):
        kind = str(plugin.get("type", ""))
        at = f"{where}: plugins[{index}] ({kind})"
        if kind not in ALLOWED_PLUGINS:
            migration.unmapped.append(
                f"{at}: not a plugin netclaim runs (allowed: {', '.join(sorted(ALLOWED_PLUGINS))})"
            )
            return None
        for capability, enabled in (plugin.get("capabilities") or {}).items():
            if enabled and capability in UNSUPPORTED_CAPABILITIES:
                migration.unmapped.append(
                    f"{at}: capability {capability}: {UNSUPPORTED_CAPABILITIES[capability]}"
                )
        if kind in ("macvlan", "ipvlan"):
            if plugin.get("master"):
                selectors.append(_attribute("ifName", str(plugin["master"])))
            else:
                migration.notes.append(
                    f"{at}: no master (Multus: the node's default-route NIC); any shared NIC is selected"
                )
            plugin["master"] = "{{ device.ifName }}"
        elif kind == "host-device":
            exclusive = True
            if plugin.get("device"):
                selectors.append(_attribute("ifName", str(plugin.pop("device"))))
            elif plugin.get("pciBusID"):
                selectors.append(f'"pciAddress" in {ATTRIBUTES}')
                selectors.append(_attribute("pciAddress", str(plugin.pop("pciBusID"))))
            plugin["device"] = "{{ device.ifName }}"
        elif kind == "bridge":
            migration.notes.append(
                f"{at}: the bridge {plugin.get('bridge', 'cni0')!r} is the node's; the claim takes a share "
                "of a NIC only to be scheduled where that network is: narrow the class's selector to the NIC "
                "on it"
            )
    resource = ((nad.get("metadata") or {}).get("annotations") or {}).get(RESOURCE_NAME)
    if resource:
        selectors.append(f"{ATTRIBUTES}.isSriovVf")
        migration.notes.append(
            f"{where}: resourceName {resource} (a device plugin's pool) is now any SR-IOV VF netclaim "
            f"publishes; narrow it with the PF ({ATTRIBUTES}.sriovPF)"
        )
    selectors.append(f"{ATTRIBUTES}.shared == {'false' if exclusive else 'true'}")
    device_class_name = f"{namespace}-{name}"
    network_name = (policed or {}).get((namespace, name), "")
    if network_name:
        selectors.append(f'"network" in {ATTRIBUTES}')
        selectors.append(_attribute("network", network_name))
        migration.notes.append(
            f"{where}: MultiNetworkPolicies name it: DeviceClass {device_class_name} selects only NICs "
            f"published with netclaim.dev/network: {network_name}, where netclaim enforces them; add "
            f"`attributes: {{netclaim.dev/network: {network_name}}}` to the publish rule of its NIC "
            "(docs/policy.md), or its pods stay Pending"
        )
    migration.notes.append(
        f"{where}: a NAD is its namespace's; its DeviceClass {namespace}-{name} is cluster-wide and its "
        "chain the admin's: keep other namespaces off it with ResourceQuota "
        f"{namespace}-{name}.deviceclass.resource.k8s.io/devices: 0 (docs/multus-users.md)"
    )
    return Network(
        namespace,
        name,
        device_class_name,
        chain,
        tuple(selectors),
        exclusive,
        resource or "",
        network_name,
    )


def device_class(network: Network, extended_resource: bool = False) -> dict[str, Any]:
    """The NAD's class; with `extended_resource`, also what a pod asking the NAD's device-plugin resource
    in its limits gets, with no claim of its own (KEP-5004)."""
    found: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {
            "name": network.device_class,
            "labels": {"netclaim.dev/migrated-from": f"{network.namespace}.{network.name}"},
        },
        "spec": {
            "selectors": [{"cel": {"expression": " && ".join(network.selectors)}}],
            "config": [
                {
                    "opaque": {
                        "driver": DRIVER_DOMAIN,
                        "parameters": {
                            "apiVersion": API_VERSION,
                            "kind": "CNIConfig",
                            "bandwidth": "none",
                            "config": network.chain,
                        },
                    }
                }
            ],
        },
    }
    if extended_resource:
        found["spec"]["extendedResourceName"] = network.extended_resource
    return found


def selections(value: str) -> list[dict[str, Any]]:
    """The networks annotation in either of its forms: JSON objects, or `ns/name@interface, ...`."""
    text = value.strip()
    if text.startswith("["):
        listed = json.loads(text)
        return [dict(item) for item in listed if isinstance(item, dict)]
    found = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = SELECTION.match(part)
        if match:
            found.append({k: v for k, v in match.groupdict().items() if v})
    return found


def _per_pod(
    chain: dict[str, Any], selection: dict[str, Any], where: str, migration: Migration
) -> dict[str, Any] | None:
    """The chain restated with the pod's own ips, mac and default route; None when it asks for none."""
    ips, mac, routes = selection.get("ips"), selection.get("mac"), selection.get("default-route")
    if not (ips or mac or routes):
        return None
    chain = copy.deepcopy(chain)
    for plugin in chain["plugins"]:
        plugin.pop("capabilities", None)  # runtime hints for Multus; a claim states the values themselves
    first = chain["plugins"][0]
    if ips:
        first["ipam"] = {"type": "static", "addresses": [{"address": ip} for ip in ips]}
        migration.notes.append(
            f"{where}: ips {', '.join(ips)}: a claim's own addresses must lie in the tenantRanges the "
            "publish policy gives tenants on the NIC (docs/policy.md); an IPPool with an AddressConfig "
            "asking these addresses holds them cluster-wide instead (docs/ipam.md)"
        )
    if routes:
        ipam = first.setdefault("ipam", {"type": "static"})
        for gateway in routes:
            halves = ("::/1", "8000::/1") if ":" in gateway else ("0.0.0.0/1", "128.0.0.0/1")
            ipam.setdefault("routes", []).extend({"dst": half, "gw": gateway} for half in halves)
        migration.notes.append(
            f"{where}: default-route {', '.join(routes)}: two half-default routes through this interface "
            "(0.0.0.0/1 and 128.0.0.0/1) take all traffic the pod's eth0 default route would; a second "
            "0.0.0.0/0 would clash with eth0's (and CNI plugins before spec 1.1 cannot set a metric)"
        )
    if mac:
        tuning = next((p for p in chain["plugins"] if p.get("type") == "tuning"), None)
        if tuning is None:
            chain["plugins"].append({"type": "tuning", "mac": mac})
        else:
            tuning["mac"] = mac
    for key in sorted(set(selection) - {"name", "namespace", "interface", "ips", "mac", "default-route"}):
        migration.unmapped.append(f"{where}: {key}: no DRA equivalent; not migrated")
    return chain


def _claim_template(
    name: str, namespace: str, network: Network, interface: str, chain: dict[str, Any] | None
) -> dict[str, Any]:
    parameters: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "CNIConfig",
        "interfaceName": interface,
    }
    if chain is not None:
        parameters["config"] = chain
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "nic", "exactly": {"deviceClassName": network.device_class}}],
                    "config": [
                        {"requests": ["nic"], "opaque": {"driver": DRIVER_DOMAIN, "parameters": parameters}}
                    ],
                }
            }
        },
    }


def _pod_template(workload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(metadata, spec) of the workload's pods."""
    keys = POD_SPECS.get(str(workload.get("kind")))
    if keys is None:
        return None
    holder: Any = workload
    for key in keys[:-1]:
        holder = holder.get(key) if isinstance(holder, dict) else None
    if not isinstance(holder, dict):
        return None
    holder.setdefault("metadata", {})
    holder.setdefault("spec", {})
    return holder["metadata"], holder["spec"]


def _drop_limits(spec: dict[str, Any], resources: set[str]) -> None:
    """The device plugin's resources out of a migrated pod's containers: its claims give it the network
    now, and a limit left there would take one more device through the resource's DeviceClass."""
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for kind in ("limits", "requests"):
            asked = (container.get("resources") or {}).get(kind) or {}
            for resource in resources & set(asked):
                del asked[resource]


def _policy_for(policy: dict[str, Any]) -> list[tuple[str, tuple[str, str] | None]]:
    """Each name of the policy's policy-for as written, with the (namespace, name) of the NAD it names (a
    name alone is in the policy's namespace); None for a netclaim network's."""
    namespace, _ = _meta(policy)
    annotations = (policy.get("metadata") or {}).get("annotations") or {}
    found: list[tuple[str, tuple[str, str] | None]] = []
    for written in str(annotations.get(POLICY_FOR, "")).replace(" ", "").split(","):
        if not written or written.startswith(NETWORK_PREFIX):
            found.append((written, None))
            continue
        nad_namespace, _, nad = written.rpartition("/")
        found.append((written, (nad_namespace or namespace, nad)))
    return [(w, k) for w, k in found if w]


def _migrated_policy(
    policy: dict[str, Any], networks: dict[tuple[str, str], Network], migration: Migration
) -> dict[str, Any] | None:
    """The policy naming the netclaim network of each migrated NAD it names, beside the NAD; None when it
    names none."""
    namespace, name = _meta(policy)
    where = f"{POLICY_KIND}/{namespace}/{name}"
    names = _policy_for(policy)
    added = []
    for written, nad in names:
        if nad is None:
            continue
        network = networks.get(nad)
        if network is None:
            migration.unmapped.append(f"{where}: policy-for {written}: no migrated NAD of that name")
            continue
        added.append(NETWORK_PREFIX + network.netclaim_network)
    if not added:
        return None
    migrated = copy.deepcopy(policy)
    meta = migrated["metadata"]
    for server_side in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
        meta.pop(server_side, None)
    migrated.pop("status", None)
    written_names = [w for w, _ in names]
    meta["annotations"][POLICY_FOR] = ", ".join(
        [*written_names, *(a for a in dict.fromkeys(added) if a not in written_names)]
    )
    migration.notes.append(
        f"{where}: now also for {', '.join(dict.fromkeys(added))} (netclaim enforces it in each selected "
        "pod's namespace on that interface); drop the Multus names once Multus is gone"
    )
    return migrated


def nad_networks(pairs: list[str]) -> dict[tuple[str, str], str]:
    """`NAMESPACE/NAD=NETWORK` pairs (the --network option) as (namespace, NAD) → network; ConfigError
    naming the pair that cannot be one."""
    named: dict[tuple[str, str], str] = {}
    for pair in pairs:
        nad, _, network = pair.partition("=")
        namespace, _, name = nad.partition("/")
        if not (namespace and name and NETWORK_NAME.fullmatch(network)):
            raise ConfigError(
                f"--network {pair!r}: expected NAMESPACE/NAD=NETWORK, NETWORK being 1-63 of "
                "A-Z a-z 0-9 _ . - starting with a letter or digit (a NIC's netclaim.dev/network)"
            )
        named[(namespace, name)] = network
    return named


def migrate(documents: list[dict[str, Any]], named: Mapping[tuple[str, str], str] | None = None) -> Migration:
    """`named`: the netclaim network the admin gives a NAD's MultiNetworkPolicies (nad_networks); by
    default `<namespace>-<NAD>`."""
    migration = Migration()
    networks: dict[tuple[str, str], Network] = {}
    mapped: dict[str, Network] = {}  # device-plugin resource → the NAD whose class now serves it
    policies = [d for d in documents if d.get("kind") == POLICY_KIND]
    policed = {
        nad: (named or {}).get(nad) or _label(f"{nad[0]}-{nad[1]}")
        for p in policies
        for _, nad in _policy_for(p)
        if nad is not None
    }
    by_network: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for nad, network_name in policed.items():
        by_network[network_name].append(nad)
    for network_name, nads in by_network.items():  # a policy of one would hold on the other's interfaces
        if len(nads) > 1 and not all(nad in (named or {}) for nad in nads):
            raise ConfigError(
                f"NADs {', '.join('/'.join(n) for n in sorted(nads))} would both become netclaim network "
                f"{network_name}: name each with --network NAMESPACE/NAD=NETWORK"
            )
    for document in documents:
        if document.get("kind") == NAD_KIND:
            network = network_of(copy.deepcopy(document), migration, policed)
            if network is None:
                continue
            networks[(network.namespace, network.name)] = network
            resource = network.extended_resource
            serves = bool(resource) and mapped.setdefault(resource, network) is network
            if serves:
                migration.notes.append(
                    f"{NAD_KIND}/{network.namespace}/{network.name}: pods that ask {resource} in their "
                    f"limits and name no network keep working: DeviceClass {network.device_class} has "
                    f"extendedResourceName {resource}, and the scheduler makes their claims from it "
                    "(remove the device plugin from the nodes netclaim serves); the migrated workloads "
                    "drop that limit"
                )
            elif resource:
                migration.notes.append(
                    f"{NAD_KIND}/{network.namespace}/{network.name}: {resource} is served by DeviceClass "
                    f"{mapped[resource].device_class} already (one class per extended resource)"
                )
            migration.objects.append(device_class(network, serves))
    templates: dict[str, dict[str, Any]] = {}
    workloads = []
    for document in documents:
        if document.get("kind") in (NAD_KIND, POLICY_KIND):
            continue
        patched = copy.deepcopy(document)
        pod = _pod_template(patched)
        annotations = (pod[0].get("annotations") or {}) if pod else {}
        if pod is None or NETWORKS not in annotations:
            continue
        namespace, workload_name = _meta(patched)
        where = f"{patched.get('kind')}/{namespace}/{workload_name}"
        try:
            chosen = selections(str(annotations[NETWORKS]))
        except ValueError as err:
            migration.unmapped.append(f"{where}: {NETWORKS} is not readable ({err}); workload left as it was")
            continue
        claims = []
        for index, selection in enumerate(chosen):
            key = (str(selection.get("namespace") or namespace), str(selection["name"]))
            network = networks.get(key)
            interface = str(selection.get("interface") or f"net{index + 1}")
            if network is None:
                migration.unmapped.append(f"{where}: network {key[0]}/{key[1]}: no migrated NAD of that name")
                continue
            chain = _per_pod(network.chain, selection, f"{where}: network {key[1]}", migration)
            # names that cannot meet: another namespace's NAD of the same name, two kinds of one name
            base = network.name if network.namespace == namespace else f"{network.namespace}-{network.name}"
            kind = str(patched.get("kind", "")).lower()
            own = f"{base}-{interface}" if chain is None else f"{kind}-{workload_name}-{base}-{interface}"
            template = _label(own)
            made = _claim_template(template, namespace, network, interface, chain)
            if templates.setdefault(f"{namespace}/{template}", made) != made:
                migration.unmapped.append(
                    f"{where}: network {key[1]}: the template name {template} is taken by a different one"
                )
                continue
            # the pod's name for the claim is the NAD's: the agent's network-status entry is then named
            # <namespace>/<NAD> as Multus names it
            twice = sum(1 for s in chosen if s["name"] == selection["name"]) > 1
            claims.append((_label(f"{network.name}-{interface}" if twice else network.name), template))
        del annotations[NETWORKS]
        spec = pod[1]
        _drop_limits(spec, {n.extended_resource for n in networks.values() if n.extended_resource})
        spec.setdefault("resourceClaims", []).extend(
            {"name": c, "resourceClaimTemplateName": t} for c, t in claims
        )
        containers = spec.get("containers") or []
        if containers and claims:
            resources = containers[0].setdefault("resources", {})
            resources.setdefault("claims", []).extend({"name": c} for c, _ in claims)
        workloads.append(patched)
    migrated = (_migrated_policy(p, networks, migration) for p in policies)
    migration.objects += [*templates.values(), *workloads, *(p for p in migrated if p is not None)]
    return migration
