"""Mutual TLS against the real secured broker: its SSL listener requires a client certificate of
the broker's CA, and the certificate's CN is the principal the ACLs name (``User:<CN>``).

A client with a certificate but no ACL is refused the topic (it is authenticated, as itself, and
authorized for nothing); with an ACL for ``User:<CN>`` it writes and reads; a client without a
certificate, or with one another CA signed, never completes the handshake."""

from __future__ import annotations

import datetime
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, TopicAuthorizationFailedError

from astraflow.topics import TopicSpec, ensure_topics, security
from astraflow.topics.acls import AclEntry, apply


@pytest.fixture
def super_user(secure_broker):
    security.install(secure_broker.secure.client_security())
    yield secure_broker
    security.uninstall()


def _producer(bootstrap: str, sec: security.ClientSecurity, **kw) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=bootstrap, client_id="mtls-test", **sec.kwargs(), **kw)


def test_a_client_certificates_cn_is_its_principal_and_its_acls_decide(super_user, tmp_path):
    broker = super_user
    setup, mtls = broker.secure, broker.mtls_bootstrap_servers
    name, topic = f"mtls-{uuid.uuid4().hex[:6]}", f"mtls.{uuid.uuid4().hex[:8]}"
    ensure_topics(broker.bootstrap_servers, [TopicSpec(topic, partitions=1)])
    sec = setup.mtls_client_security(name)
    assert sec.protocol == "SSL" and sec.password is None and sec.cert_file and sec.key_file
    p = _producer(mtls, sec, max_block_ms=15_000)
    try:  # authenticated as User:<name>, allowed nothing yet
        with pytest.raises(TopicAuthorizationFailedError):
            p.send(topic, b"before").get(timeout=15)
    finally:
        p.close(timeout=5)
    who = f"User:{name}"
    assert apply(broker.bootstrap_servers, [AclEntry(who, "TOPIC", topic, "WRITE"),
                                            AclEntry(who, "TOPIC", topic, "READ")]) == 2
    p = _producer(mtls, sec, max_block_ms=30_000)
    try:
        p.send(topic, b"after").get(timeout=30)
    finally:
        p.close(timeout=5)
    c = KafkaConsumer(bootstrap_servers=mtls, group_id=None, enable_auto_commit=False, **sec.kwargs(),
                      consumer_timeout_ms=15_000)
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        assert [r.value for r in c] == [b"after"]
    finally:
        c.close()
    # the same CN again: the certificate is reused, not reissued
    assert tuple(map(str, setup.client_certificate(name))) == (sec.cert_file, sec.key_file)


def test_without_a_certificate_of_the_brokers_ca_the_handshake_fails(super_user, tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    broker = super_user
    mtls, ca = broker.mtls_bootstrap_servers, str(broker.secure.ca_file)
    topic = f"mtls.{uuid.uuid4().hex[:8]}"  # exists: the super user (CN=admin, were it let in) could write it
    ensure_topics(broker.bootstrap_servers, [TopicSpec(topic, partitions=1)])
    bare = security.ClientSecurity(protocol="SSL", ca_file=ca)
    # a certificate that names an allowed-looking CN but is self-signed (another "CA")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    (tmp_path / "forged.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "forged.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                            serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))
    forged = security.ClientSecurity(protocol="SSL", ca_file=ca, cert_file=str(tmp_path / "forged.pem"),
                                     key_file=str(tmp_path / "forged.key"))
    for sec in (bare, forged):
        with pytest.raises(KafkaError):
            # a refused handshake fails the bootstrap: wait 8 s for it, not kafka-python's 30
            p = _producer(mtls, sec, max_block_ms=8_000, request_timeout_ms=5_000, bootstrap_timeout_ms=8_000)
            try:
                p.send(topic, b"x").get(timeout=10)
            finally:
                p.close(timeout=2)
