"""Device metadata inside the pod (KEP-5304, Kubernetes 1.37): every container that uses a claim can read
its interfaces (name, addresses, MAC; gateways, routes and network) and its devices' attributes from a file at
`/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/netclaim.dev-metadata.json`
(`resourceclaimtemplates/<pod's name for the claim>/…` for a claim made from a template), as every driver
built on Kubernetes' kubelet plugin library writes it:

- the file on the host is `<plugin data dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json`,
  a stream of one DeviceMetadata object per API version, newest first (a reader takes the first it
  can decode);
- one CDI spec for the node (`<driver>_metadata.json`, kind `<driver>/metadata`) holds a device per claim
  and request (`<claim UID>_<request>`) that bind-mounts its file read-only into the containers; prepare
  returns that CDI device with the request's first device. One file, not one per claim: containerd rereads
  every spec file of its CDI directories at each change there, so a file per claim made a node's fill cost
  O(claims²) file reads (110 pods: 33 s → 46 s in make bench);
- deferred, as the KEP made it for network devices: prepare writes generation 1 (the devices and their
  attributes; pool addresses, known by then), the sandbox hook writes generation 2 with each interface's
  networkData once it is in the pod. The runtime makes the mount when it creates a container, after the
  sandbox hook: containers see generation 2;
- networkData is the KEP's (name, addresses, MAC). What else a container needs of its interface is in the
  NIC's attributes, under netclaim.dev names: `cniNetwork` (the CNI config's network name), and from the
  ADD's CNI result `gateways` and `routes` (lists of strings, `<dst>` or `<dst> via <gw>`, as the result
  says them). The NIC's `network`, when the admin's policy names one, is a published attribute already.

Metadata never fails a claim: a file that cannot be written is logged and the claim goes without it (the
library does the same). NodeUnprepareResources removes the claim's directory and its devices from the
spec.

Prepare's and unprepare's files are written by a thread of their own, not on the event loop: each of
them rewrites the node's spec, and its file calls wait for the filesystem on a node busy starting pods
while the loop that waits with them also serves the runtime's hooks (make bench's profiles: the metadata
step of prepare was 18.8 % of the loop's busy samples during a burst, and 35.5 % of prepare's own one pod
at a time; 5.3 % once on the thread). One thread
keeps those calls in the order they were made, and the spec's devices are only read and changed there.
The hook's write (`attached`: one claim's small file, no spec) is made at once on the loop: the hook
answers the runtime only after it, under containerd's one NRI lock of the node, and a hop to the thread
(behind whatever prepares queued there) made that step 1.6 -> 11.0 ms at p50 in make bench's bursts and
0.8 -> 2.5 ms one pod at a time (two runs, the second on a slower machine). A claim's
file is written by its prepare before the hook can come (kubelet waits for the prepare), and removed by
its unprepare after the pod's sandbox has stopped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import json
import logging
import os
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from netclaim.agent.claims.gate import CDI_VERSION
from netclaim.agent.status import network_data
from netclaim.agent.store import Attachment, State
from netclaim.core.devices.catalog import typed_attribute
from netclaim.core.names import DRIVER_DOMAIN, STANDARD_DOMAIN

log = logging.getLogger(__name__)

API_VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")  # newest first
CONTAINER_ROOT = "/var/run/kubernetes.io/dra-device-attributes"
MAX_ATTRIBUTES = 32  # a reader's validation refuses more
MAX_TEXT = 64  # characters of an attribute's string, as in a ResourceSlice
SUBDIRECTORY = "dra-device-metadata"
CNI_NETWORK, GATEWAYS, ROUTES = (f"{DRIVER_DOMAIN}/{key}" for key in ("cniNetwork", "gateways", "routes"))
COMPACT = (",", ":")  # json.dumps' separators: readers parse the files, and an indent costs 5x the encoding
T = TypeVar("T")


def base_request(request: str) -> str:
    """The request a device was allocated for, without its subrequest ("nic/fast" → "nic"): the path's."""
    return request.split("/", 1)[0]


def _attributes(row: Attachment) -> dict[str, Any]:
    """The interface's attributes and the NIC's published ones. Past MAX_ATTRIBUTES the interface's are
    kept first, then the standard ones (what a reader aligning devices of several drivers looks for)."""
    found = _interface_attributes(row)
    published = sorted(
        (name for name in row.plan.nic.attributes if name not in found),
        key=lambda name: (not name.startswith(f"{STANDARD_DOMAIN}/"), name),
    )
    for name in published[: MAX_ATTRIBUTES - len(found)]:
        found[name] = typed_attribute(row.plan.nic.attributes[name])
    return dict(sorted(found.items()))


def _interface_attributes(row: Attachment) -> dict[str, Any]:
    """The CNI network's name from the plan; once attached, the gateways and routes of the ADD's result."""
    found: dict[str, Any] = {}
    name = row.plan.conflist.get("name")
    if isinstance(name, str):
        found[CNI_NETWORK] = {"string": name[:MAX_TEXT]}
    interface = row.outcome.interface
    result = row.outcome.cni_result
    if row.state != State.ATTACHED or interface is None or result is None:
        return found
    gateways = _gateways(result, interface.name)
    if gateways:
        found[GATEWAYS] = {"strings": gateways}
    routes = _routes(result)
    if routes:
        found[ROUTES] = {"strings": routes}
    return found


def _gateways(result: dict[str, Any], interface: str) -> list[str]:
    """The gateways of the result's addresses on the pod's interface (a chain may also report addresses
    of a host-side interface, by index into `interfaces`), once each, in the result's order."""
    listed = result.get("interfaces")
    interfaces = listed if isinstance(listed, list) else []
    found: list[str] = []
    ips = result.get("ips")
    for entry in ips if isinstance(ips, list) else []:
        if not isinstance(entry, dict):
            continue
        index = entry.get("interface")
        if isinstance(index, int) and 0 <= index < len(interfaces):
            named = interfaces[index]
            if not isinstance(named, dict) or named.get("name") != interface:
                continue
        gateway = _address(entry.get("gateway"))
        if gateway is not None and gateway not in found:
            found.append(gateway)
    return found


def _routes(result: dict[str, Any]) -> list[str]:
    """The result's routes as `<dst>` or `<dst> via <gw>`; one that is not a route (a destination or a
    gateway that is not an address), or longer than an attribute's string may be, is left out."""
    found: list[str] = []
    routes = result.get("routes")
    for route in routes if isinstance(routes, list) else []:
        if not isinstance(route, dict):
            continue
        try:
            destination = str(ipaddress.ip_network(str(route.get("dst")), strict=False))
        except ValueError:
            continue
        gateway = _address(route.get("gw"))
        if gateway is None and route.get("gw") is not None:
            continue
        text = f"{destination} via {gateway}" if gateway is not None else destination
        if len(text) <= MAX_TEXT and text not in found:
            found.append(text)
    return found


def _address(value: object) -> str | None:
    """An IP address in canonical form; None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def _devices(driver: str, rows: Iterable[Attachment]) -> dict[str, list[dict[str, Any]]]:
    """Request → its devices' metadata entries: each NIC, with its interface once attached, and each pool
    address device, with the addresses it gave that interface."""
    requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        nic: dict[str, Any] = {
            "driver": driver,
            "pool": row.pool,
            "name": row.device,
            "attributes": _attributes(row),
        }
        interface = row.outcome.interface
        if row.state == State.ATTACHED and interface is not None:  # as the claim's status says it
            nic["networkData"] = network_data(interface.name, interface.addresses, interface.mac)[0]
        requests[row.request].append(nic)
        for granted in row.plan.pool_addresses:
            address: dict[str, Any] = {"driver": driver, "pool": granted.pool, "name": granted.device}
            address["networkData"] = network_data(row.plan.interface_name, granted.ips)[0]
            requests[granted.request].append(address)
    return requests


def _by_base_request(driver: str, rows: Iterable[Attachment]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Base request (a file each) → its requests, subrequests apart (the file's content) → devices."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(dict)
    for request, devices in _devices(driver, rows).items():
        grouped[base_request(request)][request] = devices
    return grouped


def _stream(identity: dict[str, Any], pod_claim_name: str, requests: dict[str, list[dict[str, Any]]]) -> str:
    body: dict[str, Any] = {"metadata": identity}
    if pod_claim_name:
        body["podClaimName"] = pod_claim_name
    body["requests"] = [{"name": name, "devices": devices} for name, devices in sorted(requests.items())]
    return "".join(
        json.dumps({"kind": "DeviceMetadata", "apiVersion": version, **body}, separators=COMPACT) + "\n"
        for version in API_VERSIONS
    )


def _first_object(path: Path) -> dict[str, Any]:
    """The stream's first object (its newest version): OSError when there is no file, ValueError when
    it is not JSON, TypeError when not an object."""
    found = json.JSONDecoder().raw_decode(path.read_text())[0]
    if not isinstance(found, dict):
        raise TypeError(f"{path}: not a DeviceMetadata object")
    return found


@dataclass(frozen=True)
class _Written:
    """What a request's metadata file holds besides its devices."""

    identity: dict[str, Any]  # the claim's name, namespace, UID and the file's generation
    pod_claim_name: str

    @staticmethod
    def read(path: Path) -> _Written:
        """OSError, ValueError, KeyError or TypeError when the file is missing or not one of ours."""
        found = _first_object(path)
        identity = found["metadata"]
        if not isinstance(identity, dict):
            raise TypeError(f"{path}: metadata is not an object")
        return _Written(dict(identity), str(found.get("podClaimName", "")))


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a container created meanwhile mounts the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.chmod(0o644)
    temporary.replace(path)


class DeviceMetadataFiles:
    """The claims' metadata files under `data_dir` (the kubelet plugin's directory, as the runtime sees
    it) and the node's CDI spec of their mounts in `spec_dir`.

    The spec's devices are kept here and the file written whole at each change. At start they are the
    file's, and those of the per-claim specs earlier netclaims wrote, folded into it. `prepared` and
    `remove` do their work on the files' own thread, `attached` on the caller's (the module's docstring
    says why)."""

    def __init__(self, data_dir: Path, spec_dir: Path, driver: str) -> None:
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="metadata")
        self.root = data_dir / SUBDIRECTORY
        self.spec_dir = spec_dir
        self.driver = driver
        self.spec_path = spec_dir / f"{driver}_metadata.json"
        self._mounts: dict[str, dict[str, Any]] = {}  # CDI device name → its entry in the spec
        # claim UID → base request → what its file holds: the attach writes the next generation without
        # reading the file back (read only after a restart)
        self._written: dict[str, dict[str, _Written]] = {}
        legacy = sorted(spec_dir.glob(f"{driver}_metadata_*.json")) if spec_dir.is_dir() else []
        for path in [self.spec_path, *legacy]:
            self._mounts.update(self._read_devices(path))
        if legacy:
            try:  # the new file first: a device briefly in two files beats one in none if this fails
                self._publish()
                for path in legacy:
                    path.unlink(missing_ok=True)
            except OSError as err:
                log.warning("earlier per-claim metadata specs not folded", extra={"error": str(err)})

    @staticmethod
    def _read_devices(path: Path) -> dict[str, dict[str, Any]]:
        try:
            devices = json.loads(path.read_text()).get("devices", [])
        except (OSError, ValueError, AttributeError):
            return {}
        return {str(d["name"]): d for d in devices if isinstance(d, dict) and "name" in d}

    def _claim_dir(self, namespace: str, claim: str) -> Path:
        return self.root / f"{namespace}_{claim}"

    def _publish(self) -> None:
        """The spec with the devices now kept; none: no file (the runtime refuses a spec without devices).
        OSError when it stays as it was."""
        if not self._mounts:
            self.spec_path.unlink(missing_ok=True)
            return
        spec = {
            # not the oldest version that has mounts (0.3.0): devices are named after claims' UIDs, and a
            # name that starts with a digit needs 0.5.0 (the runtime refuses the whole spec)
            "cdiVersion": CDI_VERSION,
            "kind": f"{self.driver}/metadata",
            "devices": [self._mounts[name] for name in sorted(self._mounts)],
        }
        _write(self.spec_path, json.dumps(spec, separators=COMPACT))

    async def _on_thread(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)

    async def prepared(self, rows: list[Attachment], pod_claim_name: str | None) -> dict[str, str]:
        return await self._on_thread(functools.partial(self._prepared, rows, pod_claim_name))

    async def remove(self, namespace: str, claim: str, claim_uid: str) -> None:
        await self._on_thread(functools.partial(self._remove, namespace, claim, claim_uid))

    def _prepared(self, rows: list[Attachment], pod_claim_name: str | None) -> dict[str, str]:
        """The claim's files and its devices in the spec, written at its first prepare; base request → its
        CDI device ID, for the requests whose file and device are in place. `pod_claim_name`: the pod's
        name for a claim made from its template (the claim's resource.kubernetes.io/pod-claim-name), else
        ""; None when kubelet asks again (after a restart) and prepare answers from the store: then the files
        in place are kept (they may hold the interfaces already) and say it, a device missing from the spec
        is added again, a lost file is not written."""
        if not rows:
            return {}
        first = rows[0]
        identity = {"name": first.claim_name, "namespace": first.claim_namespace, "uid": first.claim_uid}
        ids, added = {}, []
        for request, requests in _by_base_request(self.driver, rows).items():
            path = self._claim_dir(first.claim_namespace, first.claim_name) / request / "metadata.json"
            device = f"{first.claim_uid}_{request}"
            try:
                if pod_claim_name is None:  # kubelet asks again: the file says it (none: none is written)
                    written, first_time = _Written.read(path), False
                else:  # the claim's first prepare: what an earlier claim of that name left is replaced
                    written, first_time = _Written({**identity, "generation": 1}, pod_claim_name), True
                    _write(path, _stream(written.identity, written.pod_claim_name, requests))
            except (OSError, ValueError, KeyError, TypeError) as err:
                self._not_written(first, err)
                continue
            self._written.setdefault(first.claim_uid, {})[request] = written
            name_for_pod = written.pod_claim_name
            if first_time or device not in self._mounts:
                where = (
                    f"resourceclaimtemplates/{name_for_pod}"
                    if name_for_pod
                    else f"resourceclaims/{first.claim_name}"
                )
                inside = f"{CONTAINER_ROOT}/{where}/{request}/{self.driver}-metadata.json"
                mount = {"hostPath": str(path), "containerPath": inside, "options": ["ro", "bind"]}
                self._mounts[device] = {"name": device, "containerEdits": {"mounts": [mount]}}
                added.append(device)
            ids[request] = f"{self.driver}/metadata={device}"
        if added or not self.spec_path.exists():  # a lost spec (a tmpfs emptied) is written again
            try:
                self._publish()
            except OSError as err:
                for device in added:
                    del self._mounts[device]
                self._not_written(first, err)
                return {r: i for r, i in ids.items() if i.split("=", 1)[1] not in added}
        return ids

    @staticmethod
    def _not_written(row: Attachment, err: Exception) -> None:
        log.warning(
            "device metadata not written: the claim's containers go without it",
            extra={"claim": f"{row.claim_namespace}/{row.claim_name}", "error": str(err)},
        )

    def attached(self, rows: list[Attachment]) -> None:
        """The interfaces now in the pod: each request's file rewritten whole, one generation on."""
        by_claim: dict[str, list[Attachment]] = defaultdict(list)
        for row in rows:
            by_claim[row.claim_uid].append(row)
        for claim_rows in by_claim.values():
            first = claim_rows[0]
            written_now = self._written.setdefault(first.claim_uid, {})
            for request, requests in _by_base_request(self.driver, claim_rows).items():
                path = self._claim_dir(first.claim_namespace, first.claim_name) / request / "metadata.json"
                try:
                    before = written_now.get(request)
                    if before is None:  # an agent before this one prepared it
                        if not path.exists():  # not written at prepare: turned off then, or it failed
                            continue
                        before = _Written.read(path)
                    after = _Written(
                        {**before.identity, "generation": int(before.identity["generation"]) + 1},
                        before.pod_claim_name,
                    )
                    _write(path, _stream(after.identity, after.pod_claim_name, requests))
                    written_now[request] = after
                except (OSError, ValueError, KeyError, TypeError) as err:
                    log.warning(
                        "device metadata not updated with the interfaces",
                        extra={"claim": f"{first.claim_namespace}/{first.claim_name}", "error": str(err)},
                    )

    @staticmethod
    def _owner(path: Path) -> str | None:
        """The UID of the claim a metadata file is of; None when unreadable (nobody's to keep)."""
        try:
            found = _first_object(path).get("metadata", {}).get("uid")
        except (OSError, ValueError, TypeError):
            return None
        return str(found) if found is not None else None

    def _remove(self, namespace: str, claim: str, claim_uid: str) -> None:
        """The claim's files and its devices in the spec; OSError when they stay. The directory is named
        after the claim, not its UID: one a newer claim of the same name wrote (its pod runs, its containers
        mount the file on each restart) is left to that claim."""
        self._written.pop(claim_uid, None)
        directory = self._claim_dir(namespace, claim)
        if directory.exists() and not any(
            self._owner(p) not in (claim_uid, None) for p in directory.glob("*/metadata.json")
        ):
            shutil.rmtree(directory)
        gone = {
            name: self._mounts.pop(name) for name in list(self._mounts) if name.startswith(f"{claim_uid}_")
        }
        if gone:
            try:
                self._publish()
            except OSError:
                self._mounts.update(gone)
                raise
