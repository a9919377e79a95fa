"""Signed announcements: who may move a policy's weights, and above all its lineage epoch.

An announcement on ``versions`` decides what every RaaS node loads and what the dataflow
schedules against; a newer lineage epoch fences off the trainer that wrote the older one.
So the trainer signs each announcement with its policy's Ed25519 key, and every reader
checks the signature against the policy's configured public key before the record counts.

What is signed: the exact bytes of the record's value (version, epoch, kind, policy, the
weights digest, and every manifest: each chunk's topic, partition, offset, size and BLAKE3
digest, the manifest's own digest, the delta chain) behind a domain tag and the name of the
``versions`` topic it is written to, so a signature can neither be moved to other content
nor replayed into another job's topic. The chunks themselves are not signed one by one: the
signed manifest fixes each chunk's digest, and readers check every chunk against it.

The signature travels in two headers, ``af-sig`` (base64 of the 64-byte signature) and
``af-signer`` (the key id: 16 hex digits of the SHA-256 of the raw public key, so a
rejection can say which key signed); the value stays plain JSON.

This module knows keys, bytes and headers; no job config (``trainer.signing_key`` and
friends are resolved by :mod:`astraflow.actors.signing`) and no topics beyond their names.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from astraflow.errors import FatalError
from astraflow.topics import Message
from astraflow.topics.codec import encode

__all__ = ["AnnouncementSigner", "AnnouncementVerifier", "SignatureError", "KeyFileError", "Rejection",
           "key_id", "load_private_key", "load_public_key", "ensure_key_pair", "H_SIG", "H_SIGNER"]

H_SIG = "af-sig"
H_SIGNER = "af-signer"
_DOMAIN = b"astraflow.versions.v1\x00"


class KeyFileError(FatalError, ValueError):
    """A key file is missing or holds no usable Ed25519 key; the message names the file."""


class SignatureError(Exception):
    """An announcement whose signature does not prove it came from the policy's trainer.

    ``reason`` is one of ``unsigned`` (no ``af-sig`` header), ``wrong_key`` (signed, by
    another key than the policy's), ``bad_signature`` (the signature does not match the
    bytes, or is not a signature at all).
    """

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


class Rejection(NamedTuple):
    """One announcement a reader refused (for metrics and callbacks)."""

    topic: str
    partition: int
    offset: int
    policy: str
    epoch: int  #: what the record claims, not what anyone holds
    version: int
    reason: str  #: :attr:`SignatureError.reason`, or ``wrong_base`` (:mod:`.adapters`)
    error: str  #: the whole message


def key_id(public_key: Ed25519PublicKey) -> str:
    """16 hex digits naming a public key (SHA-256 of its 32 raw bytes)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _signed_bytes(topic: str, value: bytes) -> bytes:
    return _DOMAIN + topic.encode("utf-8") + b"\x00" + value


def _header(headers: Iterable[tuple[str, bytes | None]] | None, name: str) -> bytes | None:
    for k, v in headers or ():
        if k == name:
            return v if v is not None else b""
    return None


class AnnouncementSigner:
    """Signs the announcements of one policy with its trainer's private key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id(self.public_key)

    def headers(self, topic: str, value: bytes) -> list[tuple[str, bytes]]:
        """The signature headers of a record with ``value`` written to ``topic``."""
        sig = self._key.sign(_signed_bytes(topic, value))
        return [(H_SIG, base64.b64encode(sig)), (H_SIGNER, self.key_id.encode())]

    def headers_for(self, topic: str, msg: Message) -> list[tuple[str, bytes]]:
        """The signature headers of ``msg`` as :meth:`Producer.send` will encode it."""
        return self.headers(topic, encode(msg)[0])


class AnnouncementVerifier:
    """Checks that an announcement was signed by the policy's key.

    Args:
        public_key: the policy's trainer's public key; None only with ``require=False``.
        require: refuse unsigned records (the production default). With False, unsigned
            records pass (a job written before signing, a test), records signed by
            ``public_key`` pass, and records signed otherwise are still refused; with no
            key as well, nothing is checked.
    """

    def __init__(self, public_key: Ed25519PublicKey | None, *, require: bool = True,
                 what: str = "this policy's announcements") -> None:
        if public_key is None and require:
            raise ValueError("signatures are required but no public key was given to check them with")
        self.public_key, self.require, self.what = public_key, require, what
        self.key_id = key_id(public_key) if public_key is not None else ""

    @property
    def checks(self) -> bool:
        """Whether any record can be refused."""
        return self.public_key is not None or self.require

    def check(self, topic: str, value: bytes | None, headers: Iterable[tuple[str, bytes | None]] | None) -> None:
        """Return if the record may count; raise :class:`SignatureError` saying why not."""
        sig64 = _header(headers, H_SIG)
        if sig64 is None:
            if self.require:
                raise SignatureError("unsigned", f"the record carries no {H_SIG} header; {self.what} "
                                                 f"must be signed by key {self.key_id}")
            return
        if self.public_key is None:
            return  # nothing to check against, and not required (trainer.require_signatures: false)
        signer = (_header(headers, H_SIGNER) or b"").decode("ascii", "replace")
        try:
            sig = base64.b64decode(sig64, validate=True)
            self.public_key.verify(sig, _signed_bytes(topic, value or b""))
        except (InvalidSignature, binascii.Error, ValueError):
            if signer != self.key_id:
                raise SignatureError("wrong_key", f"signed by key {signer[:16] or '(unnamed)'}, but "
                                                  f"{self.what} are signed by key {self.key_id}") from None
            raise SignatureError("bad_signature", f"the {H_SIG} signature does not match the record's bytes "
                                                  f"under key {self.key_id} (forged or altered)") from None

    def check_message(self, topic: str, msg: Message, headers: Iterable[tuple[str, bytes | None]] | None) -> None:
        """:meth:`check` for a decoded record (re-encoded: a record this code wrote keeps its bytes)."""
        try:
            value = encode(msg)[0]
        except (TypeError, ValueError) as e:  # orjson: a decoded forgery it cannot write back
            raise SignatureError("bad_signature", f"the record cannot be re-encoded to check it: {e}") from None
        self.check(topic, value, headers)


# -- key files ---------------------------------------------------------------------------
def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (PKCS#8, as ``openssl genpkey -algorithm ed25519`` writes)."""
    data = _read(path, "private")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{path}: not an unencrypted PEM private key ({e}); create one with "
                           "`openssl genpkey -algorithm ed25519 -out FILE`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: holds a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file (a private key's file also gives its public half)."""
    data = _read(path, "public")
    if b"PRIVATE KEY" in data:
        return load_private_key(path).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{path}: not a PEM public key ({e}); write one with "
                           "`openssl pkey -in PRIVATE -pubout -out FILE`") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path}: holds a {type(key).__name__}, not an Ed25519 key")
    return key


def _read(path: str | os.PathLike, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise KeyFileError(f"cannot read the {what} key file {path}: {e.strerror or e}") from None


def ensure_key_pair(private_path: str | os.PathLike, public_path: str | os.PathLike) -> bool:
    """Create an Ed25519 key pair at these paths unless the private key exists; True if created.

    Safe when several processes of one run start at once: the private key appears whole
    (written aside, then hard-linked into place; the first link wins, the others read the
    winner's), readable by its owner only; the public file is (re)written from it.
    """
    private_path, public_path = Path(private_path), Path(public_path)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    created = False
    if not private_path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        fd, tmp = tempfile.mkstemp(dir=private_path.parent, prefix=".key-")
        try:
            with os.fdopen(fd, "wb") as f:  # mkstemp: mode 0600 already
                f.write(pem)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, private_path)
                created = True
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    public = load_private_key(private_path).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    if not public_path.exists() or public_path.read_bytes() != public:
        fd, tmp = tempfile.mkstemp(dir=public_path.parent, prefix=".pub-")
        with os.fdopen(fd, "wb") as f:
            f.write(public)
        os.chmod(tmp, 0o644)
        os.replace(tmp, public_path)
    return created
