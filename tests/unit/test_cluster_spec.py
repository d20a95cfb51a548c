"""The cluster file is strict: every mistake is reported with the file and the field."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from netclaim.errors import ConfigError
from netclaim_lab import cluster
from netclaim_lab.controlplane import feature_gates
from netclaim_lab.layout import NodeLayout
from netclaim_lab.node import _containerd_config, _crio_config, runc_wrapper, withheld_capabilities
from netclaim_lab.spec import load_cluster_spec

ROOT = Path(__file__).resolve().parents[2]

VALID = """
apiVersion: netclaim.dev/v1alpha1
kind: LocalCluster
name: demo
segments: [{name: lan0}]
nodes:
- name: node-1
  nics: [{name: enp0s10, segment: lan0, mac: "02:00:00:00:0A:01",
          properties: {speed: 10Gi, pcieRoot: pci0000:5d}}]
- name: virt-1
  kubelet: false
  gpus: [{pcieRoot: pci0000:3a, count: 2}]
"""


def test_valid_file_loads_with_defaults(tmp_path: Path) -> None:
    spec = load_cluster_spec(_write(tmp_path, VALID))
    assert spec.ports.apiserver == 6443
    assert spec.nodes[0].nics[0].properties.speed == "10Gi"
    assert spec.nodes[0].nics[0].mac == "02:00:00:00:0a:01"  # as the kernel shows it
    assert str(spec.node_pod_cidr(0)) == "10.244.1.0/24"
    assert str(spec.node_address(1).ip) == "10.201.0.11"
    assert len(spec.link_prefix) == 6
    assert spec.maxPods == 110  # kubelet's own default
    assert [(g.pcieRoot, g.numaNode, g.count) for g in spec.nodes[1].gpus] == [("pci0000:3a", 0, 2)]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("kind: LocalCluster", "kind: Cluster"), "kind: Invalid enum value 'Cluster'"),
        (("apiVersion: netclaim.dev/v1alpha1\n", ""), "apiVersion: Field required"),
        (("name: demo", "name: Demo_1"), "name: Expected `str` matching regex"),
        (("name: demo\n", 'name: demo\nnriRequestTimeout: "2s\\n"\n'), "nriRequestTimeout: Expected `str`"),
        (("- name: node-1\n", "- name: node-1\n  colour: red\n"), "nodes[0].colour: unknown field"),
        (("segment: lan0,", "segment: lan9,"), "nodes[0].nics[0].segment: 'lan9' is not one of"),
        (("name: enp0s10", "name: a/b"), "nodes[0].nics[0].name: 'a/b' is not a usable interface name"),
        (("speed: 10Gi", "speed: fast"), "nodes[0].nics[0].properties.speed"),
        (("pcieRoot: pci0000:5d", "pcieRoot: 0000:5d:00.0"), "nodes[0].nics[0].properties.pcieRoot"),
        (
            ("kubelet: false", "kubelet: false\n  nics: [{name: eth1, segment: lan0}]"),
            "nodes[1].nics: a node with kubelet: false",
        ),
        (("name: virt-1", "name: node-1"), "nodes: names must be unique: node-1"),
        (
            ("segment: lan0,", "segment: lan0}, {name: enp0s10, segment: lan0,"),
            "nodes[0].nics: names must be unique within a node: enp0s10",
        ),
        (
            ("pcieRoot: pci0000:3a", "pcieRoot: 3a"),
            "nodes[1].gpus[0].pcieRoot: Expected `str` matching regex",
        ),
        (
            ("  nics: [{name: enp0s10", "  gpus: [{pcieRoot: pci0000:3a}]\n  nics: [{name: enp0s10"),
            "nodes[0].gpus: only for nodes with kubelet: false",
        ),
        (
            ("name: demo\n", "name: demo\nmaxPods: 500\n"),
            "maxPods: Expected `int` <= 250",
        ),
    ],
)
def test_mistakes_name_the_file_and_field(tmp_path: Path, change: tuple[str, str], expected: str) -> None:
    path = _write(tmp_path, VALID.replace(*change, 1))
    with pytest.raises(ConfigError) as err:
        load_cluster_spec(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_yaml_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "nodes: [unclosed")
    with pytest.raises(ConfigError, match=r"cluster\.yaml: not valid YAML"):
        load_cluster_spec(path)


def test_control_plane_ports_in_the_ephemeral_range_are_refused_naming_the_field(tmp_path: Path) -> None:
    """An outgoing connection may hold such a port when etcd starts: CI lost a run to 52380 that way."""
    low, _ = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    path = _write(tmp_path, VALID + f"ports: {{etcdPeer: {low + 1}}}\n")
    with pytest.raises(ConfigError, match=rf"ports\.etcdPeer: {low + 1} is in the ephemeral port range"):
        cluster._require_fixed_ports(load_cluster_spec(path), path)
    for spec_file in (
        ROOT / "examples/demo/cluster.yaml",
        ROOT / "tests/cluster/cluster.yaml",
        ROOT / "lab/src/netclaim_lab/benchmarks/cluster.yaml",
        ROOT / "lab/src/netclaim_lab/benchmarks/scale-cluster.yaml",
    ):
        cluster._require_fixed_ports(
            load_cluster_spec(spec_file), spec_file
        )  # the shipped ones are clear of it


def test_the_optional_ports_are_checked_too(tmp_path: Path) -> None:
    low, _ = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    path = _write(tmp_path, VALID + f"ports: {{agentApiserver: {low + 2}}}\n")
    with pytest.raises(ConfigError, match=r"ports\.agentApiserver: .* ephemeral port range"):
        cluster._require_fixed_ports(load_cluster_spec(path), path)


def test_feature_gates_and_a_node_without_nri_reach_the_components(tmp_path: Path) -> None:
    spec = load_cluster_spec(_write(tmp_path, VALID))
    assert feature_gates(spec) == "DRAConsumableCapacity=true"  # netclaim's shared NICs need it
    assert spec.nodes[0].nri is True
    off = load_cluster_spec(
        _write(
            tmp_path,
            VALID.replace(
                "kind: LocalCluster", "kind: LocalCluster\nfeatureGates: {DRAConsumableCapacity: false}"
            ).replace("- name: node-1\n", "- name: node-1\n  nri: false\n"),
        )
    )
    assert feature_gates(off) == "DRAConsumableCapacity=false"
    assert off.nodes[0].nri is False
    with pytest.raises(ConfigError, match="featureGates"):
        load_cluster_spec(
            _write(
                tmp_path,
                VALID.replace("kind: LocalCluster", "kind: LocalCluster\nfeatureGates: {dra-x: true}"),
            )
        )
    layout = NodeLayout("demo", "node-1", tmp_path / "node-1")
    assert "disable = true" in _containerd_config(layout, "2s", nri=False, containerd="2.4")
    assert "disable = false" in _containerd_config(layout, "2s", nri=True, containerd="2.4")
    # containerd 1.7 reads a version-2 file: its CRI settings in one plugin, NRI off unless enabled
    older = tomllib.loads(_containerd_config(layout, "2s", nri=True, containerd="1.7"))
    assert older["version"] == 2
    assert older["plugins"]["io.containerd.nri.v1.nri"]["disable"] is False
    cri = older["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] and cri["cni"]["bin_dir"] == "/opt/cni/bin"
    assert tomllib.loads(_containerd_config(layout, "2s", nri=True, containerd="2.4"))["version"] == 3


def test_the_containerd_version_is_one_the_matrix_builds(tmp_path: Path) -> None:
    assert load_cluster_spec(_write(tmp_path, VALID)).containerd == "2.4"
    older = VALID.replace("kind: LocalCluster", "kind: LocalCluster\ncontainerd: '2.2'")
    assert load_cluster_spec(_write(tmp_path, older)).containerd == "2.2"
    with pytest.raises(ConfigError, match="containerd"):
        load_cluster_spec(
            _write(tmp_path, VALID.replace("kind: LocalCluster", "kind: LocalCluster\ncontainerd: '2.3'"))
        )
    paired = VALID.replace("kind: LocalCluster", "kind: LocalCluster\ncontainerd: '1.7'\nkubernetes: '1.35'")
    assert load_cluster_spec(_write(tmp_path, paired)).containerd == "1.7"
    with pytest.raises(ConfigError, match="runs only with kubernetes"):
        load_cluster_spec(
            _write(tmp_path, VALID.replace("kind: LocalCluster", "kind: LocalCluster\ncontainerd: '1.7'"))
        )


def test_the_runtime_is_containerd_or_crio_and_a_containerd_version_only_goes_with_containerd(
    tmp_path: Path,
) -> None:
    assert load_cluster_spec(_write(tmp_path, VALID)).runtime == "containerd"
    crio = VALID.replace("kind: LocalCluster", "kind: LocalCluster\nruntime: crio")
    assert load_cluster_spec(_write(tmp_path, crio)).runtime == "crio"
    with pytest.raises(ConfigError, match="runtime"):
        load_cluster_spec(
            _write(tmp_path, VALID.replace("kind: LocalCluster", "kind: LocalCluster\nruntime: docker"))
        )
    with pytest.raises(ConfigError, match="containerd: a version is for runtime: containerd only"):
        load_cluster_spec(_write(tmp_path, crio.replace("runtime: crio", "runtime: crio\ncontainerd: '2.2'")))


def test_the_crio_config_keeps_the_node_to_its_own_paths_with_nri_as_containerds(tmp_path: Path) -> None:
    layout = NodeLayout("demo", "node-1", tmp_path / "node-1")
    config = tomllib.loads(_crio_config(layout, "3s", nri=True, programs=tmp_path / "crio-programs"))
    assert config["crio"]["root"].startswith(str(layout.root))
    assert config["crio"]["api"]["listen"] == str(layout.crio_socket)
    nri = config["crio"]["nri"]
    assert nri["enable_nri"] is True and nri["nri_listen"] == "/var/run/nri/nri.sock"
    assert nri["nri_plugin_request_timeout"] == "3s"
    runtime = config["crio"]["runtime"]
    assert runtime["cgroup_manager"] == "cgroupfs" and runtime["namespaces_dir"] == "/var/run"
    assert runtime["pinns_path"] == str(tmp_path / "crio-programs" / "pinns")
    assert runtime["runtimes"]["runc"]["runtime_path"] == str(layout.crio_dir / "runc")
    assert config["crio"]["network"]["plugin_dirs"] == ["/opt/cni/bin/"]
    assert "NET_RAW" in runtime["default_capabilities"]  # as containerd's: pods ping under baseline
    off = tomllib.loads(_crio_config(layout, "2s", nri=False, programs=tmp_path))
    assert off["crio"]["nri"]["enable_nri"] is False
    # every directory of its own is the node's; the standard ones it binds (layout.crio_host_paths)
    bound = {target for _, target in layout.crio_host_paths()}
    assert {"/run/lab-crio", "/run/ipcns", "/run/utsns"} <= bound
    assert "/run/crio" not in bound  # where kubelet's cAdvisor would find it and ask about every node's


def test_the_runc_wrapper_edits_only_what_this_machine_cannot_apply(tmp_path: Path) -> None:
    status = "Name:\tx\nCapBnd:\t000001fffeffffff\n"  # all of capability(7) but CAP_SYS_RESOURCE (24)
    assert withheld_capabilities(status) == ["CAP_SYS_RESOURCE"]
    assert withheld_capabilities("CapBnd:\t000001ffffffffff\n") == []
    wrapper = tmp_path / "runc"
    wrapper.write_text(runc_wrapper(Path("/bin/echo"), ["CAP_SYS_RESOURCE"]))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    caps = {
        "bounding": ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_BPF"],
        "effective": ["CAP_SYS_RESOURCE"],
        "permitted": ["CAP_CHOWN", "CAP_SYS_RESOURCE"],
    }
    spec = {
        "process": {"oomScoreAdj": -998, "capabilities": caps},
        "linux": {"resources": {"hugepageLimits": [{"pageSize": "2MB", "limit": 0}], "memory": {"limit": 5}}},
    }
    (bundle / "config.json").write_text(json.dumps(spec, indent="\t"))  # as CRI-O writes it
    ran = subprocess.run(
        ["sh", str(wrapper), "create", "--bundle", str(bundle), "c1"], capture_output=True, text=True
    )
    assert ran.stdout.split() == ["create", "--bundle", str(bundle), "c1"]  # runc gets the same arguments
    edited = json.loads((bundle / "config.json").read_text())
    assert edited["process"]["oomScoreAdj"] == 0
    assert edited["process"]["capabilities"] == {
        "bounding": ["CAP_CHOWN", "CAP_BPF"],
        "effective": [],
        "permitted": ["CAP_CHOWN"],
    }
    assert edited["linux"]["resources"] == {"hugepageLimits": [], "memory": {"limit": 5}}
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"oomScoreAdj": 500, "args": ["sh"]}, indent="\t"))
    subprocess.run(
        ["sh", str(wrapper), "exec", "--process", str(process), "c1"], check=True, capture_output=True
    )
    assert json.loads(process.read_text()) == {"oomScoreAdj": 500, "args": ["sh"]}  # positive: kept
