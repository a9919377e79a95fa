"""How this process's Kafka clients authenticate: one setting, and the only client constructors.

Every ``KafkaConsumer``, ``KafkaProducer`` and ``KafkaAdminClient`` of the project is made by
:func:`consumer`, :func:`producer` or :func:`admin`, which merge the process's
:class:`ClientSecurity` into the caller's settings (``tests/topics/test_security.py`` scans
the source and fails on a client made anywhere else). The setting is

- the one :func:`install` ed: a component (``astraflow node``), the launcher and the CLI
  commands that read a job config install ``kafka.security`` from it at start;
- else the environment (commands run without a config, Kafka tools around a job):
  ``ASTRAFLOW_KAFKA_SECURITY_PROTOCOL``, ``ASTRAFLOW_KAFKA_SASL_MECHANISM``,
  ``ASTRAFLOW_KAFKA_USERNAME``, ``ASTRAFLOW_KAFKA_PASSWORD_FILE`` (or the password itself in
  ``ASTRAFLOW_KAFKA_PASSWORD``), ``ASTRAFLOW_KAFKA_CA_FILE``, ``ASTRAFLOW_KAFKA_CERT_FILE``,
  ``ASTRAFLOW_KAFKA_KEY_FILE``, ``ASTRAFLOW_KAFKA_CHECK_HOSTNAME`` (``0`` turns it off);
- else PLAINTEXT.

A client that cannot connect because of the setting (wrong password, TLS against a
plaintext listener or the reverse, an untrusted certificate) raises
:class:`KafkaAuthError` with one line saying which and what to change, within
:data:`CONNECT_TIMEOUT_S`, instead of kafka-python's ``NoBrokersAvailable`` after its
timeouts. A password never appears in a ``repr``, a log line or an error.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from .exceptions import TopicsError

#: The client types the constructors below return are exported for annotations outside
#: ``topics/`` (which imports no kafka-python itself).
__all__ = ["CONNECT_TIMEOUT_S", "ClientSecurity", "KafkaAdminClient", "KafkaAuthError", "KafkaConsumer",
           "KafkaProducer", "MECHANISMS", "PROTOCOLS", "SecurityError", "admin", "client_kwargs", "consumer", "current", "from_env", "install", "probe", "producer",
           "read_password", "uninstall", "with_credentials"]

PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
CONNECT_TIMEOUT_S = 5.0  #: how long the probe of a setting waits for each answer
ENV_PREFIX = "ASTRAFLOW_KAFKA_"


class SecurityError(TopicsError, ValueError):
    """A client security setting that cannot work (a SASL protocol without a mechanism, a
    password file that does not exist, ...): fatal, names the key and where it came from."""


class KafkaAuthError(TopicsError):
    """The broker refused this process's clients: authentication or TLS failed, or the
    listener speaks another protocol. Fatal: the same setting fails the same way."""


@dataclass(frozen=True)
class ClientSecurity:
    """A client's protocol and credentials (kafka-python's ``security_protocol``, ``sasl_*``
    and ``ssl_*`` settings); ``source`` names where it came from, for errors."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    check_hostname: bool = True
    source: str = "default"
    #: the environment variable ``password`` was read from, if it was: a child process that
    #: inherits the environment (MirrorMaker 2) reads it there and no file need hold it
    password_env: str | None = None

    def __post_init__(self) -> None:
        def bad(key: str, problem: str) -> SecurityError:
            return SecurityError(f"{self.source}: {key}: {problem}")
        if self.protocol not in PROTOCOLS:
            raise bad("protocol", f"must be one of {list(PROTOCOLS)}, got {self.protocol!r}")
        sasl, tls = self.protocol.startswith("SASL_"), self.protocol.endswith("SSL")
        if sasl:
            if self.mechanism not in MECHANISMS:
                raise bad("sasl_mechanism", f"{self.protocol} needs one of {list(MECHANISMS)}, got {self.mechanism!r}")
            if not self.username:
                raise bad("username", f"{self.protocol} needs a username")
            if not self.password:
                raise bad("password", f"{self.protocol} needs a password (a password file or an env var)")
        elif self.mechanism or self.username or self.password:
            raise bad("sasl_mechanism", f"SASL credentials are given but protocol is {self.protocol}; use "
                                        f"SASL_SSL (or SASL_PLAINTEXT) or drop them")
        if not tls and (self.ca_file or self.cert_file or self.key_file):
            raise bad("ca_file", f"TLS files are given but protocol is {self.protocol} (no TLS); use SSL or SASL_SSL")
        if bool(self.cert_file) != bool(self.key_file):
            raise bad("cert_file" if self.key_file else "key_file", "a client certificate needs both cert_file and "
                                                                    "key_file")
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, key)
            if path and not Path(path).is_file():
                raise bad(key, f"no such file: {path}")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def kwargs(self) -> dict[str, Any]:
        """kafka-python settings; empty for PLAINTEXT (the clients' defaults)."""
        if self.protocol == "PLAINTEXT":
            return {}
        out: dict[str, Any] = {"security_protocol": self.protocol}
        if self.mechanism:
            out.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                       sasl_plain_password=self.password)
        if self.tls:
            out.update(ssl_check_hostname=self.check_hostname, ssl_cafile=self.ca_file,
                       ssl_certfile=self.cert_file, ssl_keyfile=self.key_file)
        return out

    def describe(self) -> str:
        """E.g. ``SASL_SSL (SCRAM-SHA-512 as 'raas')``; no secret."""
        who = f" ({self.mechanism} as {self.username!r})" if self.mechanism else ""
        return f"{self.protocol}{who}"

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.check_hostname = self.check_hostname
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def read_password(file: str | None, env: str | None, source: str, key: str = "password") -> str | None:
    """The password in ``file`` (its first line) or in environment variable ``env``; a
    :class:`SecurityError` naming ``source`` and ``key`` when the one given is missing or empty."""
    if file and env:
        raise SecurityError(f"{source}: {key}: give a password file or an env var, not both")
    if file:
        try:
            text = Path(file).read_text().strip()
        except OSError as e:
            raise SecurityError(f"{source}: {key}_file: cannot read {file}: {e.strerror or e}") from None
        if not text:
            raise SecurityError(f"{source}: {key}_file: {file} is empty")
        return text.splitlines()[0]
    if env:
        value = os.environ.get(env, "")
        if not value:
            raise SecurityError(f"{source}: {key}_env: environment variable {env} is not set (or empty)")
        return value
    return None


def from_env(environ: Mapping[str, str] | None = None) -> ClientSecurity:
    """The setting the ``ASTRAFLOW_KAFKA_*`` variables describe (PLAINTEXT when none is set)."""
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        return env.get(ENV_PREFIX + name) or None

    file = get("PASSWORD_FILE")
    if file:
        try:
            password = read_password(file, None, "environment", "password")
        except SecurityError as e:
            raise SecurityError(f"environment: {ENV_PREFIX}PASSWORD_FILE: {str(e).split(': ', 2)[-1]}") from None
        from_var = None
    else:
        password = get("PASSWORD")
        # only a variable of this process's own environment is one a child process inherits
        from_var = ENV_PREFIX + "PASSWORD" if password and environ is None else None
    return ClientSecurity(protocol=get("SECURITY_PROTOCOL") or "PLAINTEXT", mechanism=get("SASL_MECHANISM"),
                          username=get("USERNAME"), password=password, ca_file=get("CA_FILE"),
                          cert_file=get("CERT_FILE"), key_file=get("KEY_FILE"),
                          check_hostname=(get("CHECK_HOSTNAME") or "1").lower() not in ("0", "false", "no"),
                          source="environment (ASTRAFLOW_KAFKA_*)", password_env=from_var)


_lock = threading.Lock()
_installed: ClientSecurity | None = None


def install(security: ClientSecurity) -> ClientSecurity:
    """Make ``security`` this process's client setting (every client made from now on)."""
    global _installed
    with _lock:
        _installed = security
    return security


def uninstall() -> None:
    """Back to the environment's setting (tests)."""
    global _installed
    with _lock:
        _installed = None


def current() -> ClientSecurity:
    """The installed setting, else the environment's."""
    return _installed if _installed is not None else from_env()


def client_kwargs() -> dict[str, Any]:
    """The current setting as kafka-python keyword arguments."""
    return current().kwargs()


# -- the only constructors -------------------------------------------------------------

_verified: set[tuple[str, ClientSecurity]] = set()  #: (bootstrap, setting) pairs a probe has accepted


def _build(cls: type, args: tuple, kwargs: dict[str, Any], security: ClientSecurity | None) -> Any:
    sec = security or current()
    bootstrap = kwargs.get("bootstrap_servers")
    if isinstance(bootstrap, str) and (bootstrap, sec) not in _verified:
        ok, why = probe(bootstrap, sec)
        if why is not None:
            raise KafkaAuthError(why)
        if ok:
            _verified.add((bootstrap, sec))
    return cls(*args, **{**sec.kwargs(), **kwargs})


def consumer(*topics: str, security: ClientSecurity | None = None, record_reader: bool = True,
             **kwargs: Any) -> KafkaConsumer:
    """A ``KafkaConsumer`` with the process's security setting (or ``security``), whose
    group joins survive short polls (:mod:`.group_join`) and whose fetched records are read
    by the C record reader (:mod:`.records`; ``record_reader=False``: by kafka-python's own)."""
    from . import records
    from .group_join import keep_completed_joins
    kc = keep_completed_joins(_build(KafkaConsumer, topics, kwargs, security))
    return records.install(kc) if record_reader else kc


def producer(*, security: ClientSecurity | None = None, **kwargs: Any) -> KafkaProducer:
    """A ``KafkaProducer`` with the process's security setting (or ``security``)."""
    return _build(KafkaProducer, (), kwargs, security)


def admin(*, security: ClientSecurity | None = None, **kwargs: Any) -> KafkaAdminClient:
    """A ``KafkaAdminClient`` with the process's security setting (or ``security``)."""
    return _build(KafkaAdminClient, (), kwargs, security)


# -- why a connection is refused: one probe, a few requests by hand ----------------------
# Kafka's wire format (kafka.apache.org/protocol): a request is int32 size, int16 api key,
# int16 api version, int32 correlation id, string client id, then its body; a response is
# int32 size, int32 correlation id, then its body. Only non-flexible versions are used.

_CLIENT_ID = b"astraflow-probe"


class _Closed(Exception):
    """The broker closed the connection."""


class _Silent(Exception):
    """The broker sent nothing in time (paused, overloaded): no diagnosis."""


def _request(sock: socket.socket, api_key: int, version: int, body: bytes) -> bytes:
    head = struct.pack(">hhih", api_key, version, 7, len(_CLIENT_ID)) + _CLIENT_ID
    sock.sendall(struct.pack(">i", len(head) + len(body)) + head + body)
    size = struct.unpack(">i", _recv(sock, 4))[0]
    return _recv(sock, size)[4:]  # minus the correlation id


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        try:
            chunk = sock.recv(n - len(out))
        except (socket.timeout, TimeoutError) as e:
            raise _Silent(str(e)) from None
        except (OSError, ssl.SSLError) as e:
            raise _Closed(str(e)) from None
        if not chunk:
            raise _Closed("connection closed")
        out += chunk
    return out


def _string(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return struct.pack(">h", len(data)) + data


def _authenticate(sock: socket.socket, sec: ClientSecurity) -> str | None:
    """SaslHandshake v1 + SaslAuthenticate v1 rounds; the broker's refusal, or None."""
    body = _request(sock, 17, 1, _string(sec.mechanism or ""))
    error, n = struct.unpack(">hi", body[:6])
    if error:
        offered, pos = [], 6
        for _ in range(max(n, 0)):
            ln = struct.unpack(">h", body[pos:pos + 2])[0]
            offered.append(body[pos + 2:pos + 2 + ln].decode())
            pos += 2 + ln
        return (f"does not enable SASL mechanism {sec.mechanism} (it offers {offered or 'none'}); set "
                f"kafka.security.sasl_mechanism to one of them")
    if sec.mechanism == "PLAIN":
        steps: list = [lambda _b: b"\0" + (sec.username or "").encode() + b"\0" + (sec.password or "").encode()]
        finish: list = [lambda _b: None]
    else:
        from kafka.net.sasl.scram import ScramClient
        scram = ScramClient(sec.username, sec.password, sec.mechanism)
        steps = [lambda _b: scram.first_message(), lambda b: (scram.process_server_first_message(b),
                                                               scram.final_message())[1]]
        finish = [lambda _b: None, scram.process_server_final_message]
    reply = b""
    for step, done in zip(steps, finish):
        token = step(reply)
        body = _request(sock, 36, 1, struct.pack(">i", len(token)) + token)
        error, ln = struct.unpack(">hh", body[:4])
        message = body[4:4 + ln].decode(errors="replace") if ln >= 0 else ""
        pos = 4 + max(ln, 0)
        if error:
            return (f"refused SASL authentication of user {sec.username!r} ({sec.mechanism}): "
                    f"{message or f'error code {error}'}; check its password and that the user exists")
        size = struct.unpack(">i", body[pos:pos + 4])[0]
        reply = body[pos + 4:pos + 4 + max(size, 0)]
        try:
            done(reply)
        except Exception as e:  # noqa: BLE001 - a server signature that does not verify
            return f"answered a SCRAM exchange that does not verify ({e})"
    return None


#: how long a probe waits before asking again when every broker that answered refused the setting
PROBE_RECHECK_S = 1.0


def probe(bootstrap_servers: str, security: ClientSecurity,
          timeout_s: float = CONNECT_TIMEOUT_S) -> tuple[bool, str | None]:
    """Connect once as ``security`` would: ``(True, None)`` when a broker accepts it,
    ``(False, why)`` with one line saying why not and what to change when the setting is
    the reason, ``(False, None)`` when nothing answers at all (the caller's own error or
    wait stands: a broker may be starting).

    A refusal is only believed when it holds: a broker that is shutting down also accepts a
    connection and closes it at the first request, which is what a TLS listener does to a
    plaintext client. So the probe asks the next bootstrap address after a refusal (any that
    accepts the setting settles it), and asks them all again after :data:`PROBE_RECHECK_S`
    before it reports one: a dying broker refuses the connection by then, a misconfigured
    setting is refused the same way again. (A chaos run's dataflow, restarted while a broker
    was being killed for good, took that broker's closed connection for "the listener wants
    TLS" and stopped as misconfigured.)"""
    from .bootstrap import parse_bootstrap
    addresses = parse_bootstrap(bootstrap_servers)
    ok, why = _probe_each(addresses, security, timeout_s)
    if ok or why is None:
        return ok, None
    time.sleep(PROBE_RECHECK_S)
    return _probe_each(addresses, security, timeout_s)


def _probe_each(addresses, sec: ClientSecurity, timeout_s: float) -> tuple[bool, str | None]:
    """``(True, None)`` when one of ``addresses`` accepts ``sec``; else ``(False, why)`` with
    the first refusal's line (the setting is the reason), ``why`` None when none that
    answered said anything."""
    first: str | None = None
    setting = f"client security {sec.describe()}, from {sec.source}"
    for host, port in addresses:  # a cluster may have lost one: the next is asked
        try:
            raw = socket.create_connection((host, port), timeout=timeout_s)
        except OSError:
            continue
        with raw:
            raw.settimeout(timeout_s)
            try:
                ok, why = _probe(raw, host, f"Kafka at {host}:{port}", sec, setting)
            except _Silent:
                ok, why = False, None
        if ok:
            return True, None
        first = first or why
    return False, first


def _probe(raw: socket.socket, host: str, where: str, sec: ClientSecurity, setting: str) -> tuple[bool, str | None]:
    sock = raw
    if sec.tls:
        try:
            sock = sec.ssl_context().wrap_socket(raw, server_hostname=host)
        except ssl.SSLCertVerificationError as e:
            return False, (f"{where}: its TLS certificate is not trusted ({e.verify_message}); set the CA "
                           f"that signed it as kafka.security.ca_file ({setting})")
        except (socket.timeout, TimeoutError):
            return False, None
        except (ssl.SSLError, OSError) as e:
            return False, (f"{where}: TLS handshake failed ({getattr(e, 'reason', None) or e}); is the "
                           f"listener plaintext? ({setting})")
    try:
        try:
            _request(sock, 18, 0, b"")  # ApiVersions: answered before any authentication
        except _Closed:
            if not sec.tls:
                return False, (f"{where} closed the connection at a plaintext request: the listener wants "
                               f"TLS; set kafka.security (protocol SASL_SSL or SSL, ca_file) or "
                               f"ASTRAFLOW_KAFKA_SECURITY_PROTOCOL ({setting})")
            return False, f"{where} closed the connection at its first request ({setting})"
        if sec.mechanism:
            try:
                refused = _authenticate(sock, sec)
            except _Closed:
                return False, f"{where} closed the connection during SASL authentication ({setting})"
            return (False, f"{where} {refused} ({setting})") if refused else (True, None)
        try:  # Metadata v4, every topic: a SASL listener closes an unauthenticated connection here
            _request(sock, 3, 4, struct.pack(">ib", -1, 0))
        except _Closed:
            return False, (f"{where} closed the connection before authentication: the listener wants SASL; "
                           f"set kafka.security.protocol SASL_SSL (or SASL_PLAINTEXT), sasl_mechanism, username "
                           f"and a password ({setting})")
        return True, None
    finally:
        if sock is not raw:
            sock.close()


def with_credentials(security: ClientSecurity, username: str, password: str) -> ClientSecurity:
    """``security`` as another user (an operator's setting, a component principal's password)."""
    return replace(security, username=username, password=password)
