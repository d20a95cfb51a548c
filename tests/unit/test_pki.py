from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from netclaim_lab.pki import CertificateAuthority


def test_issued_certificates_chain_to_the_ca_and_carry_identity(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("kubelet-node-1", "system:node:node-1", ("system:nodes",), client=True)
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    root = x509.load_pem_x509_certificate(ca.pair.cert.read_bytes())
    cert.verify_directly_issued_by(root)
    assert cert.subject.rfc4514_string() == "CN=system:node:node-1,O=system:nodes"
    assert isinstance(root.public_key(), ec.EllipticCurvePublicKey)
    assert pair.key.stat().st_mode & 0o777 == 0o600
    server = ca.issue(
        "apiserver", "kube-apiserver", server=True, ip_addresses=("10.0.0.1",), dns_names=("k",)
    )
    names = (
        x509.load_pem_x509_certificate(server.cert.read_bytes())
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.1"]
