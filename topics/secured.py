"""A secured embedded broker: SASL_SSL (SCRAM-SHA-512), a per-run CA, ACLs enforced.

:class:`SecureSetup` makes what one secured broker needs, in a directory of its own (mode
0700): a self-signed CA and a broker certificate it signs (``cryptography``; SAN
``127.0.0.1`` and ``localhost``), the super user's random password, and the broker
properties that turn on

- one client listener, ``SASL_SSL``, authenticating every client by SCRAM-SHA-512 (the
  broker talks to itself over it as the super user ``admin``);
- the KRaft controller listener over mutual TLS: only a client holding a certificate of
  this CA named ``astraflow-broker`` (the broker itself) is the super user there;
- ``StandardAuthorizer``: a principal may do only what an ACL allows it (``super.users``
  excepted; no ACL means no access);
- with :class:`~.broker.EmbeddedBroker` also a mutual-TLS client listener (``SSL``): a client
  certificate of this CA is required and its CN is the principal
  (:meth:`SecureSetup.client_certificate` issues one).

The super user's SCRAM credential is written into the metadata log when storage is
formatted (``kafka-storage format --add-scram``): the broker needs it before anything could
create it. Other users are added with :func:`add_users` (the AlterUserScramCredentials
admin API) by the super user. ``client_security()`` is the super user's client setting;
``admin.properties`` is the same for Kafka's own tools (``astraflow kafka kafka-acls
--command-config ...``).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from .security import ClientSecurity

__all__ = ["BROKER_PRINCIPAL", "MECHANISM", "SUPER_USER", "SecureSetup", "add_users", "new_password"]

MECHANISM = "SCRAM-SHA-512"
SUPER_USER = "admin"  #: the SCRAM super user: the broker's own inter-broker identity and the operator's
BROKER_PRINCIPAL = "astraflow-broker"  #: the CN of the broker's certificate: its identity on the controller listener
_DAYS = 30


def new_password() -> str:
    return secrets.token_urlsafe(24)


def _write_private(path: Path, data: bytes | str) -> None:
    """Write a file only its owner can read (created 0600, never world-readable in between)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


@dataclass
class SecureSetup:
    """The CA, the broker's key and certificate and the super user's password, in ``dir``.

    :meth:`create` makes them once; a directory that already holds them is reused (a
    restarted broker keeps its CA, so clients' ``ca_file`` stays valid).
    """

    dir: Path

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def ca_key_file(self) -> Path:
        return self.dir / "ca.key"

    @property
    def broker_pem(self) -> Path:
        return self.dir / "broker.pem"  # the broker's private key, then its certificate chain

    @property
    def password_file(self) -> Path:
        return self.dir / "admin.password"

    @property
    def admin_properties(self) -> Path:
        return self.dir / "admin.properties"

    @property
    def super_password(self) -> str:
        return self.password_file.read_text().strip()

    @classmethod
    def create(cls, dir: str | os.PathLike) -> "SecureSetup":  # noqa: A002
        setup = cls(Path(dir))
        setup.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(setup.dir, 0o700)
        if not (setup.ca_file.exists() and setup.broker_pem.exists() and setup.password_file.exists()):
            setup._make_pki()
            _write_private(setup.password_file, new_password() + "\n")
        setup._write_admin_properties()
        return setup

    def _make_pki(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID

        now = datetime.datetime.now(datetime.timezone.utc)
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ca = _signed(f"astraflow-ca-{secrets.token_hex(4)}", ca_key.public_key(), None, ca_key,
                     now + datetime.timedelta(days=_DAYS),
                     (x509.BasicConstraints(ca=True, path_length=0), True),
                     (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                                    key_agreement=False, encipher_only=False, decipher_only=False), True))
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        cert = _signed(BROKER_PRINCIPAL, key.public_key(), ca, ca_key, now + datetime.timedelta(days=_DAYS),
                       (x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                     x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False),
                       (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                        False))
        self.ca_file.write_bytes(_pem(ca))
        # The CA's key stays beside the super user's password (0600 in this 0700 directory, which
        # already holds every key to the broker): it issues client certificates for mutual TLS.
        _write_private(self.ca_key_file, _pem(ca_key))
        _write_private(self.broker_pem, _pem(key) + _pem(cert) + _pem(ca))

    def client_certificate(self, name: str) -> tuple[Path, Path]:
        """A client certificate of this CA for principal ``name`` (its CN; the broker maps it to
        ``User:<name>``), for the mutual-TLS listener: ``(cert_file, key_file)``, made once (mode
        0600, under ``clients/``) and reused."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID

        if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or name in (SUPER_USER, BROKER_PRINCIPAL):
            raise ValueError(f"client certificate: {name!r} is not a principal name this broker maps "
                             f"(letters, digits, '.', '_', '-'; not {SUPER_USER!r} or {BROKER_PRINCIPAL!r})")
        folder = self.dir / "clients"
        cert_file, key_file = folder / f"{name}.pem", folder / f"{name}.key"
        if cert_file.exists() and key_file.exists():
            return cert_file, key_file
        if not self.ca_key_file.exists():
            raise ValueError(f"client certificate: {self.dir} has no CA key (made before client certificates "
                             f"existed); make a new secure directory")
        folder.mkdir(mode=0o700, exist_ok=True)
        ca = x509.load_pem_x509_certificate(self.ca_file.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key_file.read_bytes(), password=None)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        cert = _signed(name, key.public_key(), ca, ca_key, ca.not_valid_after_utc,
                       (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False))
        _write_private(key_file, _pem(key))
        _write_private(cert_file, _pem(cert))
        return cert_file, key_file

    def mtls_client_security(self, name: str) -> ClientSecurity:
        """The client setting of principal ``name`` on the mutual-TLS listener (no password)."""
        cert_file, key_file = self.client_certificate(name)
        return ClientSecurity(protocol="SSL", ca_file=str(self.ca_file), cert_file=str(cert_file),
                              key_file=str(key_file), source=f"{self.dir} (client certificate {name})")

    def _write_admin_properties(self) -> None:
        _write_private(self.admin_properties, (
            "security.protocol=SASL_SSL\n"
            f"sasl.mechanism={MECHANISM}\n"
            f"sasl.jaas.config={_jaas(SUPER_USER, self.super_password)}\n"
            "ssl.truststore.type=PEM\n"
            f"ssl.truststore.location={self.ca_file}\n"))

    def broker_properties(self, port: int, controller_port: int, mtls_port: int | None = None) -> dict[str, str]:
        """``server.properties`` entries of a secured node (combined broker + controller; the nodes of a
        cluster share them, each with its own ports); ``mtls_port``: also a mutual-TLS client
        listener (``SSL``, a certificate of this CA required; its CN is the principal)."""
        controller = f"CONTROLLER://127.0.0.1:{controller_port}"
        mtls = f",SSL://127.0.0.1:{mtls_port}" if mtls_port else ""
        extra = {"listener.name.ssl.ssl.client.auth": "required"} if mtls_port else {}
        return {
            **extra,
            "listeners": f"SASL_SSL://127.0.0.1:{port}{mtls},{controller}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}{mtls},{controller}",
            "listener.security.protocol.map": "CONTROLLER:SSL,SASL_SSL:SASL_SSL,SSL:SSL",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": _jaas(SUPER_USER, self.super_password),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.broker_pem),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "listener.name.controller.ssl.client.auth": "required",
            # A certificate's principal is its CN (CN=astraflow-broker -> User:astraflow-broker).
            "ssl.principal.mapping.rules": "RULE:^CN=([A-Za-z0-9._-]+)$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{SUPER_USER};User:{BROKER_PRINCIPAL}",
            "allow.everyone.if.no.acl.found": "false",
        }

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments writing the super user's SCRAM credential."""
        return ["--add-scram", f"{MECHANISM}=[name={SUPER_USER},password={self.super_password}]"]

    def client_security(self, username: str = SUPER_USER, password: str | None = None) -> ClientSecurity:
        """The client setting of ``username`` (default: the super user) on this broker."""
        return ClientSecurity(protocol="SASL_SSL", mechanism=MECHANISM, username=username,
                              password=self.super_password if password is None else password,
                              ca_file=str(self.ca_file), source=str(self.dir))

    def describe(self) -> dict:
        """What a client needs, minus secrets: the CA file, the mechanism, the password file."""
        return {"protocol": "SASL_SSL", "sasl_mechanism": MECHANISM, "super_user": SUPER_USER,
                "ca_file": str(self.ca_file), "password_file": str(self.password_file),
                "command_config": str(self.admin_properties)}


def _signed(cn: str, public_key, issuer, issuer_key, not_after, *extensions):
    """A certificate for ``cn`` signed by ``issuer_key`` (``issuer``: its certificate; None:
    self-signed), valid from five minutes ago to ``not_after``; ``extensions``: (extension,
    critical) pairs."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer.subject if issuer is not None else subject)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(item) -> bytes:
    """A certificate, or a private key (PKCS8, unencrypted), as PEM."""
    from cryptography.hazmat.primitives import serialization

    pem = serialization.Encoding.PEM
    if hasattr(item, "private_bytes"):
        return item.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return item.public_bytes(pem)


def _jaas(user: str, password: str) -> str:
    return (f'org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username={json.dumps(user)} password={json.dumps(password)};')


def add_users(bootstrap_servers: str, users: dict[str, str], iterations: int = 4096) -> None:
    """Create (or reset) the SCRAM-SHA-512 credentials ``{user: password}``, as the process's
    installed client setting (the super user's). Raises :class:`~.exceptions.TopicsError`
    naming the user whose credential the broker refused."""
    from kafka.admin import ScramMechanism, UserScramCredentialUpsertion

    from .exceptions import TopicsError
    from .security import admin

    client = admin(bootstrap_servers=bootstrap_servers, client_id="astraflow-users")
    try:
        result = client.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(u, ScramMechanism.SCRAM_SHA_512, p, iterations=iterations)
             for u, p in users.items()])
    finally:
        client.close()
    failed = {u: e for u, e in result.items() if e}
    if failed:
        raise TopicsError("the broker refused SCRAM credentials: "
                          + "; ".join(f"{u}: {e}" for u, e in failed.items()))
