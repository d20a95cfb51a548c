"""charts/netclaim, rendered by the pinned helm: lint is clean, the default values render deploy/ object for
object, and each value reaches the objects it is for (and only those)."""

from __future__ import annotations

import difflib
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from netclaim.core.config import strict
from netclaim.core.config.publishpolicy import PublishPolicy
from netclaim.core.config.validate import ALLOWED_PLUGINS
from netclaim.errors import PrerequisiteError
from netclaim_lab import manifests
from netclaim_lab.binaries import built_bin_dir
from netclaim_lab.layout import REPO_ROOT

pytestmark = pytest.mark.programs

CHART = REPO_ROOT / "charts" / "netclaim"
RELEASE_VALUES = REPO_ROOT / "tests" / "releases" / "chart-0.1.0-values.yaml"
DEPLOY = REPO_ROOT / "deploy"
NAMESPACE = "netclaim-system"

Key = tuple[str, str, str, str]  # apiVersion, kind, namespace ("" when cluster-scoped), name
Objects = dict[Key, dict[str, Any]]
DAEMONSET: Key = ("apps/v1", "DaemonSet", NAMESPACE, "netclaim-agent")
DEPLOYMENT: Key = ("apps/v1", "Deployment", NAMESPACE, "netclaim-controller")
POLICY: Key = ("v1", "ConfigMap", NAMESPACE, "netclaim-policy")
CONFIG_POLICY: Key = (
    "admissionregistration.k8s.io/v1",
    "ValidatingAdmissionPolicy",
    "",
    "netclaim-config",
)


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return built_bin_dir() / "helm"
    except PrerequisiteError as err:
        pytest.fail(f"{err} (helm is one of the pinned programs: `.venv/bin/netclaim-lab cluster build`)")


def _run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, check=False, timeout=120)


def _objects(text: str, source: str) -> Objects:
    objects: Objects = {}
    for document in yaml.safe_load_all(text):
        if not document:
            continue
        meta = document["metadata"]
        key = (document["apiVersion"], document["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in objects, f"{source}: {key} twice"
        objects[key] = document
    return objects


def render(helm: Path, *args: str, namespace: str = NAMESPACE) -> Objects:
    result = _run(helm, "template", "netclaim", str(CHART), "--namespace", namespace, *args)
    assert result.returncode == 0, f"helm template {' '.join(args)} failed:\n{result.stderr}"
    return _objects(result.stdout, "helm template")


def _container(objects: Objects, key: Key) -> dict[str, Any]:
    container: dict[str, Any] = objects[key]["spec"]["template"]["spec"]["containers"][0]
    return container


def _volume(objects: Objects, name: str) -> dict[str, Any]:
    volumes = objects[DAEMONSET]["spec"]["template"]["spec"]["volumes"]
    volume: dict[str, Any] = next(v for v in volumes if v["name"] == name)
    return volume


def _mount(objects: Objects, name: str) -> dict[str, Any]:
    mount: dict[str, Any] = next(
        m for m in _container(objects, DAEMONSET)["volumeMounts"] if m["name"] == name
    )
    return mount


def _admin_plugins(objects: Objects) -> tuple[list[str], list[str]]:
    """(DeviceClass list, claim list) of the allowedPlugins variable of the netclaim-config policy."""
    variables = objects[CONFIG_POLICY]["spec"]["variables"]
    expression = next(v["expression"] for v in variables if v["name"] == "allowedPlugins")
    admin, tenant = (re.findall(r"'([^']+)'", names) for names in re.findall(r"\[([^\]]*)\]", expression))
    return admin, tenant


def _values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_helm_lint_is_clean(helm: Path) -> None:
    for extra in ([], ["--set", "namespace.create=false,controller.enabled=false,crds.keep=true"]):
        result = _run(helm, "lint", "--strict", str(CHART), *extra)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"helm lint --strict {' '.join(extra)}:\n{output}"
        assert "[WARNING]" not in output, output
        assert "[ERROR]" not in output, output
        assert "1 chart(s) linted, 0 chart(s) failed" in output, output


def test_deploy_is_the_chart_rendered_with_its_defaults(helm: Path) -> None:
    """One source: deploy/ is what `make deploy` renders from the chart, byte for byte."""
    rendered = manifests.render(helm)
    on_disk = manifests.on_disk()
    assert on_disk.keys() == rendered.keys(), (
        "deploy/ has other files than the chart renders: run make deploy"
    )
    for name, text in rendered.items():
        if on_disk[name] != text:
            diff = difflib.unified_diff(
                on_disk[name].splitlines(), text.splitlines(), f"deploy/{name}", "chart", lineterm=""
            )
            pytest.fail(
                f"deploy/{name} differs from the chart's rendering (run make deploy):\n" + "\n".join(diff)
            )


def test_the_default_plugin_list_is_what_netclaim_validate_allows(helm: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["admission"]["deviceClassPlugins"]) == ALLOWED_PLUGINS
    assert set(_admin_plugins(render(helm))[0]) == ALLOWED_PLUGINS


def test_image_values_reach_agent_and_controller(helm: Path) -> None:
    objects = render(helm, "--set", "image.repository=r.example/nc,image.tag=9.9.9,image.pullPolicy=Always")
    for key in (DAEMONSET, DEPLOYMENT):
        assert _container(objects, key)["image"] == "r.example/nc:9.9.9"
        assert _container(objects, key)["imagePullPolicy"] == "Always"
    assert _container(render(helm), DAEMONSET)["image"] == "registry.example.com/netclaim:0.1.0"  # appVersion


def test_cni_bin_dirs_are_searched_in_order_and_moving_them_moves_the_flag_the_mounts_and_nothing_else(
    helm: Path, tmp_path: Path
) -> None:
    default = render(helm)
    assert "--cni-bin-dir=/opt/cni/bin" in _container(default, DAEMONSET)["args"]
    both = render(helm, "--set", "agent.hostPaths.cniBinDirs={/opt/cni/bin,/usr/lib/cni}")
    assert "--cni-bin-dir=/opt/cni/bin:/usr/lib/cni" in _container(both, DAEMONSET)["args"]
    for name, path in (("cni-bin", "/opt/cni/bin"), ("cni-bin-1", "/usr/lib/cni")):
        assert _volume(both, name)["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}
        assert _mount(both, name) == {"name": name, "mountPath": path, "readOnly": True}
    moved = render(helm, "--set", "agent.hostPaths.cniBinDirs={/var/lib/cni/bin}")
    text = yaml.safe_dump(moved[DAEMONSET])
    assert "/opt/cni/bin" not in text and "cni-bin-1" not in text
    assert yaml.safe_dump(default[DAEMONSET]).replace("/opt/cni/bin", "/var/lib/cni/bin") == text
    assert {k: v for k, v in moved.items() if k != DAEMONSET} == {
        k: v for k, v in default.items() if k != DAEMONSET
    }
    # chart 0.1.0's one-directory value still wins when set
    kept = render(helm, "--set", "agent.hostPaths.cniBinDir=/var/lib/cni/bin")
    assert yaml.safe_dump(kept[DAEMONSET]) == text
    # `helm upgrade --reuse-values` from 0.1.0: its values as they were, without cniBinDirs
    values = yaml.safe_load(RELEASE_VALUES.read_text())
    assert "cniBinDirs" not in values["agent"]["hostPaths"]
    upgraded = render(helm, "-f", _values_file(tmp_path, values))
    assert _container(upgraded, DAEMONSET)["args"] == _container(default, DAEMONSET)["args"]


def test_host_paths_reach_flags_and_mounts(helm: Path) -> None:
    objects = render(
        helm,
        "--set",
        "agent.hostPaths.nriSocket=/run/containerd/nri/nri.sock,agent.hostPaths.cdiSpecDir=/etc/cdi,"
        "agent.hostPaths.kubeletRootDir=/var/lib/k0s/kubelet,agent.hostPaths.stateDir=/srv/netclaim,"
        "agent.hostPaths.cniConfDir=/etc/cni/conf.d",
    )
    args = _container(objects, DAEMONSET)["args"]
    for flag in (
        "--nri-socket=/run/containerd/nri/nri.sock",
        "--cdi-spec-dir=/etc/cdi",
        "--kubelet-root-dir=/var/lib/k0s/kubelet",
        "--state-dir=/srv/netclaim",
        "--cni-conf-dir=/etc/cni/conf.d",
    ):
        assert flag in args
    for volume, path in (
        ("nri", "/run/containerd/nri"),
        ("cdi", "/etc/cdi"),
        ("kubelet-plugins", "/var/lib/k0s/kubelet/plugins"),
        ("kubelet-registry", "/var/lib/k0s/kubelet/plugins_registry"),
        ("state", "/srv/netclaim"),
        ("cni-conf", "/etc/cni/conf.d"),
    ):
        assert _volume(objects, volume)["hostPath"]["path"] == path
        assert _mount(objects, volume)["mountPath"] == path  # the same path inside: kubelet and CDI see it


def test_no_nic_overrides_drops_the_flag_and_the_volume(helm: Path) -> None:
    objects = render(helm, "--set", "agent.hostPaths.nicOverridesDir=")
    assert not [a for a in _container(objects, DAEMONSET)["args"] if a.startswith("--nic-overrides")]
    assert "nic-overrides" not in yaml.safe_dump(objects[DAEMONSET])


def test_scheduling_resources_port_and_args_values(helm: Path, tmp_path: Path) -> None:
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "net", "effect": "NoSchedule"}]
    values = {
        "agent": {
            "nodeSelector": {"netclaim.dev/nics": "yes"},
            "tolerations": tolerations,
            "affinity": None,  # Helm merges maps: null drops the default (not on netclaim.dev/agent=disabled)
            "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}},  # limits: the default's
            "metricsPort": 9300,
            "extraArgs": ["--log-level=debug"],
        },
        "controller": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}, "metricsPort": 9301},
    }
    objects = render(helm, "-f", _values_file(tmp_path, values))
    pod = objects[DAEMONSET]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"netclaim.dev/nics": "yes"}
    assert pod["tolerations"] == tolerations
    assert pod["affinity"] == {"nodeAffinity": _required([PLATFORM])}  # the default's term dropped
    agent = _container(objects, DAEMONSET)
    assert agent["resources"] == {
        "requests": {"cpu": "100m", "memory": "200Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert "--metrics-address=$(NODE_IP):9300" in agent["args"]
    assert agent["args"][-1] == "--log-level=debug"
    assert agent["readinessProbe"]["httpGet"]["port"] == agent["livenessProbe"]["httpGet"]["port"] == 9300
    controller_pod = objects[DEPLOYMENT]["spec"]["template"]["spec"]
    assert controller_pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert "--metrics-address=0.0.0.0:9301" in controller_pod["containers"][0]["args"]


def test_policy_value_becomes_the_configmap_the_agent_reads_and_there_is_none_by_default(
    helm: Path, tmp_path: Path
) -> None:
    policy = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "PublishPolicy",
        "rules": [{"match": {"names": ["eth1"]}, "mode": "exclusive"}, {"mode": "ignore"}],
    }
    configmap = render(helm, "-f", _values_file(tmp_path, {"policy": policy}))[POLICY]
    rendered = configmap["data"]["policy.yaml"]
    assert yaml.safe_load(rendered) == policy
    # an upgrade that no longer gives the value leaves it (test_install runs one)
    assert configmap["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    strict.decode(PublishPolicy, yaml.safe_load(rendered), "the rendered policy")
    # without the value no ConfigMap: the agents publish nothing until the admin writes one, and an upgrade
    # from the chart or deploy/ never replaces the admin's
    assert POLICY not in render(helm)
    daemonset = render(helm)[DAEMONSET]["spec"]["template"]["spec"]
    assert {"name": "policy", "configMap": {"name": "netclaim-policy", "optional": True}} in daemonset[
        "volumes"
    ]
    # a policy file, verbatim with its comments
    text = (
        "# the lab's NICs\napiVersion: netclaim.dev/v1alpha1\nkind: PublishPolicy\nrules:\n- mode: shared\n"
    )
    (tmp_path / "policy.yaml").write_text(text)
    objects = render(helm, "--set-file", f"policy={tmp_path / 'policy.yaml'}")
    assert objects[POLICY]["data"]["policy.yaml"] == text


def test_plugin_list_drives_the_admission_policy(helm: Path) -> None:
    objects = render(helm, "--set", "admission.deviceClassPlugins={macvlan,bridge,host-local}")
    admin, tenant = _admin_plugins(objects)
    assert admin == ["macvlan", "bridge", "host-local"]
    assert tenant == _admin_plugins(render(helm))[1]  # a tenant's list is the agent's, not a value
    refused = _run(
        helm, "template", "netclaim", str(CHART), "--set", "admission.deviceClassPlugins={macvlan,a']+['b}"
    )
    assert refused.returncode != 0
    assert "deviceClassPlugins" in refused.stderr


def test_controller_disabled_drops_the_controller_and_only_it(helm: Path) -> None:
    default, without = render(helm), render(helm, "--set", "controller.enabled=false")
    dropped = {k for k in default if k[3] == "netclaim-controller"}
    assert {k[1] for k in dropped} == {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",  # the ConfigMaps of admission policy netclaim-pool-namespaces, in its namespace
        "RoleBinding",
    }
    assert without == {k: v for k, v in default.items() if k not in dropped}


def test_namespace_and_crd_switches(helm: Path) -> None:
    default = render(helm)
    namespace: Key = ("v1", "Namespace", "", NAMESPACE)
    assert render(helm, "--set", "namespace.create=false") == {
        k: v for k, v in default.items() if k != namespace
    }
    policies: Key = (
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "",
        "multi-networkpolicies.k8s.cni.cncf.io",
    )
    assert render(helm, "--set", "crds.multiNetworkPolicy=false") == {
        k: v for k, v in default.items() if k != policies
    }
    crds = {k for k in default if k[1] == "CustomResourceDefinition"}
    assert len(crds) == 3 and policies in crds
    ipam = crds - {policies}  # crds.install: the IPAM CRDs; the policies' CRD has a value of its own
    assert render(helm, "--set", "crds.install=false") == {k: v for k, v in default.items() if k not in ipam}
    # the policies' CRD holds other projects' policies too: never deleted by an uninstall
    assert default[policies]["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert all("annotations" not in default[key]["metadata"] for key in ipam)
    kept = render(helm, "--set", "crds.keep=true")
    for key in crds:
        assert kept[key]["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_kubectl_apply_and_delete_of_deploy_never_reach_the_policies_crd() -> None:
    """`kubectl apply -f deploy/` and `kubectl delete -f deploy/` read deploy/'s own files, not its
    directories: the MultiNetworkPolicy CRD, created apart and only where absent, is never deleted by them."""
    top = {p.name: p.read_text() for p in DEPLOY.glob("*.yaml")}
    assert not any("multi-networkpolicies.k8s.cni.cncf.io" in text for text in top.values())
    apart = yaml.safe_load((DEPLOY / "multinetworkpolicy" / "crd.yaml").read_text())
    assert apart["metadata"]["name"] == "multi-networkpolicies.k8s.cni.cncf.io"


def test_another_namespace_moves_every_object_and_the_agents_identity(helm: Path) -> None:
    objects = render(helm, namespace="dra-net")
    assert ("v1", "Namespace", "", "dra-net") in objects
    namespaced = [k for k in objects if k[2]]
    assert namespaced
    assert all(k[2] == "dra-net" for k in namespaced)
    text = yaml.safe_dump(list(objects.values()))
    assert NAMESPACE not in text
    assert text.count("system:serviceaccount:dra-net:netclaim-agent") == 5  # the agent's own-node policies
    subjects = [s for k, o in objects.items() if k[1] == "ClusterRoleBinding" for s in o["subjects"]]
    assert {s["namespace"] for s in subjects} == {"dra-net"}


PLATFORM = [
    {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
]


def _required(terms: list[list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions} for expressions in terms]
        }
    }


def test_both_pods_run_only_on_linux_nodes_of_the_images_architectures(helm: Path, tmp_path: Path) -> None:
    """Required in every node term (terms are ORed), beside what the affinity values say; kept with the
    controller's spreading default, and following image.architectures."""
    objects = render(helm)
    agent = objects[DAEMONSET]["spec"]["template"]["spec"]["affinity"]
    disabled = {"key": "netclaim.dev/agent", "operator": "NotIn", "values": ["disabled"]}
    assert agent == {"nodeAffinity": _required([[disabled, *PLATFORM]])}
    controller = objects[DEPLOYMENT]["spec"]["template"]["spec"]["affinity"]
    assert controller["nodeAffinity"] == _required([PLATFORM])
    assert (
        controller["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 100
    )

    rack = {"key": "rack", "operator": "In", "values": ["a"]}
    zone = {"key": "zone", "operator": "In", "values": ["z"]}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [rack]}}]
    affinity = {
        "nodeAffinity": {
            **_required([[rack], [zone]]),
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        }
    }
    values = {
        "image": {"architectures": ["amd64", "arm64"]},
        "agent": {"affinity": affinity},
        "controller": {"affinity": affinity},
    }
    objects = render(helm, "-f", _values_file(tmp_path, values))
    both = [PLATFORM[0], {**PLATFORM[1], "values": ["amd64", "arm64"]}]
    for key in (DAEMONSET, DEPLOYMENT):
        assert objects[key]["spec"]["template"]["spec"]["affinity"] == {
            "nodeAffinity": {
                **_required([[rack, *both], [zone, *both]]),
                "preferredDuringSchedulingIgnoredDuringExecution": preferred,
            }
        }, key


def test_invalid_values_are_refused(helm: Path) -> None:
    for setting in (
        "image.architectures={s390x}",
        "image.architectures={}",
        "agent.hostPaths.cniBinDirs={usr/lib/cni}",
        "agent.hostPaths.cniBinDirs={/opt/cni:/usr/lib/cni}",  # one directory an item, not a search path
        "agent.hostPaths.cniBinDir=/opt/cni/bin:/var/lib/netclaim",
        "agent.hostPaths.stateDir=/",  # the node's root, read-write
        "agent.metricsPort=0",
        "agent.typo=1",
    ):
        result = _run(helm, "template", "netclaim", str(CHART), "--set", setting)
        assert result.returncode != 0, setting
        assert "values don't meet the specifications of the schema" in result.stderr, result.stderr


def _leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of the values (a map of free-form keys, like nodeSelector, counts as one)."""
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        free_form = key in {"labels", "nodeSelector", "affinity", "resources", "policy"}
        if isinstance(value, dict) and value and not free_form:
            paths += _leaves(value, f"{path}.")
        else:
            paths.append(path)
    return paths


def test_every_value_is_documented() -> None:
    documented = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [path for path in _leaves(values) if f"`{path}`" not in documented]
    assert not missing, f"charts/netclaim/README.md does not describe {missing}"


def test_without_the_network_status_annotation_the_agent_cannot_read_or_patch_pods(helm: Path) -> None:
    def agent(objects: Objects) -> tuple[list[str], list[dict[str, Any]]]:
        daemonset = next(o for k, o in objects.items() if k[1] == "DaemonSet")
        role = next(o for k, o in objects.items() if k[1] == "ClusterRole" and k[3] == "netclaim-agent")
        return daemonset["spec"]["template"]["spec"]["containers"][0]["args"], role["rules"]

    args, rules = agent(render(helm))  # the default
    assert "--network-status-annotation=false" in args
    assert not [r for r in rules if "pods" in r["resources"]]
    args, rules = agent(render(helm, "--set", "agent.networkStatusAnnotation=true"))
    assert "--network-status-annotation=true" in args
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]} in rules
