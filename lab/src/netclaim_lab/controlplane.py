"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler of the local cluster."""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from netclaim.errors import TransientError
from netclaim_lab import processes
from netclaim_lab.layout import ClusterLayout
from netclaim_lab.pki import CertificateAuthority, KeyPair, write_service_account_keys
from netclaim_lab.spec import ClusterSpec

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"


def feature_gates(spec: ClusterSpec) -> str:
    """--feature-gates of the cluster's components, from the cluster file's featureGates (by default
    DRAConsumableCapacity=true: beta and on by default in v1.37, set explicitly because netclaim's shared
    NICs depend on it; DRAResourceClaimDeviceStatus, DRAExtendedResource and DRADeviceTaints are GA)."""
    return ",".join(f"{gate}={'true' if on else 'false'}" for gate, on in sorted(spec.featureGates.items()))


# Pod Security `baseline` enforced wherever a namespace says nothing, as managed clusters do: what needs
# more (netclaim's agent) must say so in its namespace's labels (deploy/00-namespace.yaml).
_ADMISSION = {
    "apiVersion": "apiserver.config.k8s.io/v1",
    "kind": "AdmissionConfiguration",
    "plugins": [
        {
            "name": "PodSecurity",
            "configuration": {
                "apiVersion": "pod-security.admission.config.k8s.io/v1",
                "kind": "PodSecurityConfiguration",
                "defaults": {"enforce": "baseline", "enforce-version": "latest"},
                "exemptions": {"usernames": [], "runtimeClasses": [], "namespaces": []},
            },
        }
    ],
}
_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "resources": [{"group": "resource.k8s.io"}],
            "verbs": ["create", "update", "patch", "delete", "deletecollection"],
        },
        # every request of the agents (docs/scale.md: what each agent reads, per event; tests check it)
        {"level": "Metadata", "users": ["system:serviceaccount:netclaim-system:netclaim-agent"]},
        {"level": "None"},
    ],
}


def client_certificate(pair: KeyPair) -> dict[str, str]:
    return {"client-certificate": str(pair.cert), "client-key": str(pair.key)}


def write_kubeconfig(path: Path, server: str, ca: Path, user: str, credentials: dict[str, str]) -> None:
    """A kubeconfig for `user` (credentials: a client certificate, or a token) at `server`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


class ControlPlane:
    def __init__(self, spec: ClusterSpec, layout: ClusterLayout, bin_dir: Path) -> None:
        self.spec = spec
        self.layout = layout
        self.bin = bin_dir
        self.address = str(spec.management_gateway().ip)
        self.server = f"https://{self.address}:{spec.ports.apiserver}"
        self.ca: CertificateAuthority | None = None

    # --- certificates -------------------------------------------------------------------------
    def write_pki(self) -> CertificateAuthority:
        pki = self.layout.pki
        ca = CertificateAuthority(pki)
        self.ca = ca
        ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns_names=(
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "localhost",
            ),
            ip_addresses=(self.address, "127.0.0.1", SERVICE_IP),
        )
        ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",), client=True
        )
        write_service_account_keys(pki)
        for name, user, groups in (
            ("admin", "netclaim-admin", ("system:masters",)),
            ("controller-manager", "system:kube-controller-manager", ()),
            ("scheduler", "system:kube-scheduler", ()),
        ):
            pair = ca.issue(name, user, groups, client=True)
            kubeconfig = self.layout.admin_kubeconfig if name == "admin" else pki / f"{name}.kubeconfig"
            write_kubeconfig(kubeconfig, self.server, ca.pair.cert, user, client_certificate(pair))
        return ca

    def node_kubeconfig(self, node: str, path: Path) -> None:
        assert self.ca is not None, "write_pki() first"
        pair = self.ca.issue(f"kubelet-{node}", f"system:node:{node}", ("system:nodes",), client=True)
        write_kubeconfig(
            path, self.server, self.ca.pair.cert, f"system:node:{node}", client_certificate(pair)
        )

    # --- processes -----------------------------------------------------------------------------
    def _start(self, name: str, command: list[str]) -> None:
        processes.start(name, command, pid_dir=self.layout.pids, log_dir=self.layout.logs)

    def start_etcd(self) -> None:
        ports = self.spec.ports
        self._start(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--name=netclaim",
                f"--data-dir={self.layout.etcd_data}",
                f"--listen-client-urls=http://127.0.0.1:{ports.etcdClient}",
                f"--advertise-client-urls=http://127.0.0.1:{ports.etcdClient}",
                f"--listen-peer-urls=http://127.0.0.1:{ports.etcdPeer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ports.etcdPeer}",
                f"--initial-cluster=netclaim=http://127.0.0.1:{ports.etcdPeer}",
                "--listen-metrics-urls=",
                "--log-level=warn",
                "--quota-backend-bytes=2147483648",
                # a throwaway local cluster: 2-core CI machines cannot afford fsync stalls
                "--unsafe-no-fsync",
            ],
        )
        _wait_http(f"http://127.0.0.1:{ports.etcdClient}/health", "etcd", self.layout.logs / "etcd.log")

    def start_apiserver(
        self, name: str = "kube-apiserver", port: int | None = None, authorization: str = "Node,RBAC"
    ) -> None:
        """The cluster's API server, or (name, port) another one on the same etcd and certificates."""
        pki = self.layout.pki
        port = port or self.spec.ports.apiserver
        audit_log = self.layout.apiserver_audit_log(name)
        policy = pki / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(_AUDIT_POLICY))
        admission = pki / "admission.yaml"
        admission.write_text(yaml.safe_dump(_ADMISSION))
        self._start(
            name,
            [
                str(self.bin / "kube-apiserver"),
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={port}",
                f"--etcd-servers=http://127.0.0.1:{self.spec.ports.etcdClient}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--authorization-mode={authorization}",
                "--enable-admission-plugins=NodeRestriction",
                f"--admission-control-config-file={admission}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                f"--feature-gates={feature_gates(self.spec)}",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=200",
                "--profiling=false",
                "--endpoint-reconciler-type=none",
                "--kubelet-preferred-address-types=InternalIP",
            ],
        )
        self.wait_healthy(name, f"https://{self.address}:{port}/readyz")

    def start_controller_manager(self) -> None:
        pki = self.layout.pki
        self._start(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={pki / 'controller-manager.kubeconfig'}",
                "--leader-elect=false",
                "--secure-port=0",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*",
                f"--feature-gates={feature_gates(self.spec)}",
                f"--kube-api-qps={self.spec.controllerManagerQPS}",
                f"--kube-api-burst={2 * self.spec.controllerManagerQPS}",
            ],
        )

    def start_scheduler(self) -> None:
        pki = self.layout.pki
        config = pki / "scheduler.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(pki / "scheduler.kubeconfig"),
                        "qps": self.spec.schedulerQPS,
                        "burst": 2 * self.spec.schedulerQPS,
                    },
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self._start(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                f"--config={config}",
                *self._scheduler_serving(),
                f"--feature-gates={feature_gates(self.spec)}",
            ],
        )

    def _scheduler_serving(self) -> list[str]:
        port = self.spec.ports.schedulerMetrics
        if port is None:
            return ["--secure-port=0"]
        # /metrics and CPU profiles to anyone on the loopback address: a throwaway local cluster's benchmark
        allowed = "/healthz,/readyz,/livez,/metrics,/debug/pprof/*"
        return [
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            f"--authorization-always-allow-paths={allowed}",
        ]

    def wait_healthy(self, component: str, url: str, timeout: float = 90) -> None:
        pki = self.layout.pki
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        _wait_http(url, component, self.layout.logs / f"{component}.log", context, timeout)


def _wait_http(
    url: str, component: str, log: Path, context: ssl.SSLContext | None = None, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:  # noqa: S310 - our own URL
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}"
        except (OSError, urllib.error.URLError) as err:
            last = str(err)
        time.sleep(0.3)
    raise TransientError(
        f"{component} did not become healthy at {url} in {timeout:.0f} s ({last}); see {log}"
    )
