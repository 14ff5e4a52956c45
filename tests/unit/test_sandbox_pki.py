"""Certificates and kubeconfigs the sandbox generates verify as Kubernetes expects."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import config as kconfig

from fixtures.sandbox.pki import PKI, write_kubeconfig


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_ca_signs_serving_and_client_certificates(tmp_path: Path) -> None:
    authority = PKI(tmp_path)
    authority.create_ca()
    serving = authority.issue_serving()
    admin = authority.issue_client("admin", "gpuconf-admin", ("system:masters",))
    ca = load(authority.ca.cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for pair in (serving, admin):
        cert = load(pair.cert)
        cert.verify_directly_issued_by(ca)  # raises if the chain is wrong
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca

    sans = load(serving.cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    usage = load(serving.cert).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage

    subject = load(admin.cert).subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpuconf-admin"
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    usage = load(admin.cert).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage


def test_private_keys_are_owner_only(tmp_path: Path) -> None:
    authority = PKI(tmp_path)
    authority.create_ca()
    sa = authority.create_service_account_keys()
    for key in (authority.ca.key, sa.key, authority.issue_client("u", "u").key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_service_account_public_key_matches_private(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    sa = PKI(tmp_path).create_service_account_keys()
    private = serialization.load_pem_private_key(sa.key.read_bytes(), password=None)
    public = serialization.load_pem_public_key(sa.cert.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert private.public_key().public_numbers() == public.public_numbers()


def test_kubeconfig_is_self_contained_and_loads(tmp_path: Path) -> None:
    authority = PKI(tmp_path / "pki")
    authority.create_ca()
    pair = authority.issue_client("admin", "gpuconf-admin", ("system:masters",))
    path = write_kubeconfig(
        tmp_path / "kubeconfig", "https://127.0.0.1:16443", authority.ca.cert, pair, "gpuconf-admin"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = yaml.safe_load(path.read_text())
    assert data["current-context"] == "gpuconf-sandbox"
    assert data["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:16443"
    assert "certificate-authority-data" in data["clusters"][0]["cluster"]
    assert "client-key-data" in data["users"][0]["user"]
    api = kconfig.new_client_from_config(config_file=str(path))
    assert api.configuration.host == "https://127.0.0.1:16443"
    assert Path(api.configuration.cert_file).read_bytes() == pair.cert.read_bytes()
