"""The cluster file is strict: every mistake is reported with the file and the field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from netclaim.errors import ConfigError
from netclaim_lab import cluster
from netclaim_lab.controlplane import feature_gates
from netclaim_lab.layout import NodeLayout
from netclaim_lab.node import _containerd_config
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
