"""How a job's Kafka clients authenticate: the ``kafka.security`` section and a cluster's own setting.

:class:`ClientAuth` holds what every client login takes (protocol, SASL user and password
source, TLS files) and the rules they obey together; it reads the password and makes the
:class:`~astraflow.topics.security.ClientSecurity` a client uses. Two settings build on it:
:class:`ClusterSecurityConfig` (a cluster other than the job's own: a region's, the RaaS
nodes' weights cluster) and :class:`KafkaSecurityConfig` (the job's, which adds a principal
per component role and the embedded broker's own setting). :func:`install_security` makes a
job's setting the one this process's clients use. Passwords are never in the YAML: a file
(first line) or an environment variable holds each. This module knows nothing about the
other sections of a job, nor how a client connects (:mod:`astraflow.topics.security`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from astraflow.topics import security
from astraflow.topics.security import ClientSecurity, SecurityError, read_password
from astraflow.typed_config import ConfigError
from astraflow.typed_config import setting

#: The component roles a job's principals are named for (``kafka.security.principals``, ``astraflow acl``).
PRINCIPAL_ROLES = ("raas", "trainer", "dataflow", "admin")
#: The roles whose nodes serve one policy: ``principals`` may name ``<role>.<policy>`` for them.
POLICY_ROLES = ("raas", "trainer")
_SASL_KEYS = ("sasl_mechanism", "username", "password_file", "password_env")
_TLS_KEYS = ("ca_file", "cert_file", "key_file")


def principal_role(key: str) -> tuple[str, str | None]:
    """``"trainer.solver"`` -> ``("trainer", "solver")``; ``"raas"`` -> ``("raas", None)``."""
    role, _, policy = key.partition(".")
    return role, policy or None


def _under(base_dir: str | Path, p: str | None) -> str | None:
    """A relative path taken from ``base_dir`` (resolved); an absolute one or None as it is."""
    return p if p is None or Path(p).is_absolute() else str(Path(base_dir, p).resolve())


@dataclass(frozen=True)
class ClientAuth:
    """The keys of one client login: protocol, SASL user and password source, TLS files."""

    protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"] = setting(
        "PLAINTEXT", "the listener's security protocol (SASL_SSL: TLS + a SASL login)")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = setting(
        None, "SASL mechanism of the SASL_* protocols")
    username: str | None = setting(None, "the SASL user")
    password_file: str | None = setting(None, "a file holding that user's password (first line; relative to the file "
                                              "that names it)")
    password_env: str | None = setting(None, "an environment variable holding that user's password")
    ca_file: str | None = setting(None, "PEM file of the CA(s) that signed the brokers' certificates (SSL, SASL_SSL; "
                                        "null: the system's)")
    cert_file: str | None = setting(None, "PEM client certificate (mutual TLS; with key_file)")
    key_file: str | None = setting(None, "PEM private key of cert_file (unencrypted PKCS#8)")
    check_hostname: bool = setting(True, "check the broker certificate's name against the address dialled")

    def problem(self) -> tuple[str, str] | None:
        """The first inconsistency as ``(key, what is wrong)``, or None (files are read by the client)."""
        sasl, tls = self.protocol.startswith("SASL_"), self.protocol.endswith("SSL")
        if sasl:
            if self.sasl_mechanism is None:
                return "sasl_mechanism", f"{self.protocol} needs one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
            bad = self._login_problem()
            if bad:
                return bad
        else:
            for name in _SASL_KEYS:
                if getattr(self, name) is not None:
                    return name, f"set, but protocol {self.protocol} has no SASL login; use SASL_SSL or drop it"
            bad = self._unused_login_problem()
            if bad:
                return bad
        if not tls:
            for name in _TLS_KEYS:
                if getattr(self, name) is not None:
                    return name, f"set, but protocol {self.protocol} has no TLS; use SSL or SASL_SSL or drop it"
        if (self.cert_file is None) != (self.key_file is None):
            return ("key_file" if self.cert_file else "cert_file",
                    "a client certificate needs both cert_file and key_file")
        return None

    def _login_problem(self) -> tuple[str, str] | None:
        """With SASL: one user, and exactly one source of its password."""
        if not self.username:
            return "username", f"{self.protocol} needs a user"
        if bool(self.password_file) == bool(self.password_env):
            return "password_file", "give exactly one of password_file and password_env (the password is never inline)"
        return None

    def _unused_login_problem(self) -> tuple[str, str] | None:
        """Without SASL: what else is set that only a SASL login uses (none here)."""
        return None

    def absolute(self, base_dir: str | Path) -> "ClientAuth":
        """The same setting with its relative paths taken from ``base_dir``."""
        return dataclasses.replace(self, **{k: _under(base_dir, getattr(self, k))
                                            for k in ("password_file", *_TLS_KEYS)})

    def _client_security(self, file: str, key: str, base_dir: str | Path, error: type, source: str,
                         login: object = None, login_key: str | None = None,
                         pass_env: bool = False) -> ClientSecurity:
        """The :class:`ClientSecurity` of ``login`` (what has ``username``, ``password_file`` and
        ``password_env``: this setting, or a principal of it under ``login_key``): its password read
        now, relative paths from ``base_dir``; ``error(file, key, problem)`` names the key that
        cannot be used. ``pass_env`` keeps the variable a password came from, for a child process
        that inherits the environment. A :class:`SecurityError` of the result is the caller's."""
        sec, login = self.absolute(base_dir), login or self
        password = None
        if sec.protocol.startswith("SASL_"):
            try:
                password = read_password(_under(base_dir, login.password_file), login.password_env, file, "password")
            except SecurityError as e:
                which = "password_file" if login.password_file else "password_env"
                raise error(file, f"{login_key or key}.{which}", str(e).split(": ", 2)[-1]) from None
        for name in _TLS_KEYS:
            value = getattr(sec, name)
            if value is not None and not Path(value).is_file():
                raise error(file, f"{key}.{name}", f"no such file: {value}")
        return ClientSecurity(protocol=sec.protocol, mechanism=sec.sasl_mechanism, username=login.username,
                              password=password, ca_file=sec.ca_file, cert_file=sec.cert_file,
                              key_file=sec.key_file, check_hostname=sec.check_hostname, source=source,
                              password_env=login.password_env if pass_env and password is not None else None)


@dataclass(frozen=True)
class ClusterSecurityConfig(ClientAuth):
    """How clients authenticate to one Kafka cluster other than the job's own (a region's existing
    cluster: topology ``regions.<r>.kafka_security``, and the ``rollout.weights_security`` its RaaS
    nodes get from it): the keys of ``kafka.security`` without principals."""

    def overrides(self, prefix: str) -> list[str]:
        """``--set`` pairs carrying it to a process (no secret: only file and variable names)."""
        return [f"{prefix}.{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default]

    def client(self, file: str, key: str, base_dir: str | Path = ".", error: type = None) -> ClientSecurity:
        """The :class:`~astraflow.topics.security.ClientSecurity` it describes: the password read
        from its file or variable, relative paths from ``base_dir``; ``error`` (default
        :class:`ConfigError`) naming ``file`` and the key (under ``key``) that cannot be used."""
        error = error or ConfigError
        try:
            return self._client_security(file, key, base_dir, error, f"{key} of {file}", pass_env=True)
        except SecurityError as e:
            raise error(file, key, str(e).split(": ", 1)[-1]) from None


@dataclass(frozen=True)
class KafkaPrincipal:
    username: str = setting(help="the SCRAM/PLAIN user this role's processes authenticate as")
    password_file: str | None = setting(None, "a file holding its password (first line; relative to the config file)")
    password_env: str | None = setting(None, "an environment variable holding its password")

    def __post_init__(self) -> None:
        if bool(self.password_file) == bool(self.password_env):
            raise ValueError("give exactly one of password_file and password_env (the password is never inline)")


@dataclass(frozen=True)
class KafkaSecurityConfig(ClientAuth):
    """How every Kafka client of the job authenticates (docs/security.md): a :class:`ClientAuth`
    whose user may differ per component role (``principals``)."""

    username: str | None = setting(None, "the SASL user of every role without an entry in principals")
    principals: dict[str, KafkaPrincipal] = setting({}, "per role (raas, trainer, dataflow, admin), or per role and "
                                                        "policy (raas.<policy>, trainer.<policy>): its own user, so "
                                                        "ACLs give each only what it needs (`astraflow acl plan`)")
    embedded: bool = setting(False, "secure the embedded broker `astraflow run` starts: SASL_SSL (SCRAM-SHA-512), "
                                    "ACLs per principal, a user and a password file (0600) per principal made in the "
                                    "run dir's secure/; the run sets the other keys (leave them unset)")

    def __post_init__(self) -> None:
        key = "kafka.security"
        if self.embedded:
            for f in dataclasses.fields(self):
                default = f.default_factory() if f.default is dataclasses.MISSING else f.default
                if f.name != "embedded" and getattr(self, f.name) != default:
                    raise ValueError(f"{key}.{f.name}: set, but {key}.embedded makes the run's own settings; drop "
                                     f"one of them")
        bad = self.problem()
        if bad:
            raise ValueError(f"{key}.{bad[0]}: {bad[1]}")
        for name in self.principals:
            role, policy = principal_role(name)
            if role not in PRINCIPAL_ROLES:
                raise ValueError(f"{key}.principals.{name}: unknown role {role!r} (roles: "
                                 f"{', '.join(PRINCIPAL_ROLES)}; per policy: {', '.join(POLICY_ROLES)})")
            if policy is not None and role not in POLICY_ROLES:
                raise ValueError(f"{key}.principals.{name}: the {role} serves every policy: name it {role!r} "
                                 f"(per policy: {', '.join(f'{r}.<policy>' for r in POLICY_ROLES)})")

    def _login_problem(self) -> tuple[str, str] | None:
        """``username`` may be left out when ``principals`` names every role; with it, its password."""
        covered = {principal_role(k)[0] for k in self.principals}  # per policy: JobConfig checks each policy
        if self.username is None and covered != set(PRINCIPAL_ROLES):
            return "username", (f"{self.protocol} needs a user (or principals for every role: "
                                f"{', '.join(PRINCIPAL_ROLES)})")
        if self.username is not None and bool(self.password_file) == bool(self.password_env):
            return "password_file", ("give exactly one of password_file and password_env for kafka.security.username "
                                     "(the password is never inline)")
        return None

    def _unused_login_problem(self) -> tuple[str, str] | None:
        if self.principals:
            return "principals", f"set, but protocol {self.protocol} has no SASL login"
        return None

    def principal_key(self, role: str, policy: str | None = None) -> str | None:
        """The ``principals`` entry ``role``'s node serving ``policy`` logs in as: ``<role>.<policy>``
        when there is one, else ``<role>``; None when neither (then ``username``)."""
        if policy is not None and role in POLICY_ROLES and f"{role}.{policy}" in self.principals:
            return f"{role}.{policy}"
        return role if role in self.principals else None

    def username_of(self, role: str, policy: str | None = None) -> str | None:
        """The user ``role``'s processes (serving ``policy``) authenticate as (None without SASL)."""
        k = self.principal_key(role, policy)
        return self.principals[k].username if k else self.username

    def check_policies(self, policies: tuple[str, ...], file: str) -> None:
        """Each ``<role>.<policy>`` names a policy of the job, and without ``username`` every
        policy of a role named only per policy has its own entry; :class:`ConfigError` naming the key."""
        for name in self.principals:
            role, policy = principal_role(name)
            if policy is not None and policy not in policies:
                raise ConfigError(file, f"kafka.security.principals.{name}",
                                  f"no policy {policy!r} (policies: {', '.join(policies)})")
        if self.username is None and self.protocol.startswith("SASL_"):
            for role in POLICY_ROLES:
                missing = [p for p in policies if self.principal_key(role, p) is None]
                if missing:
                    raise ConfigError(file, f"kafka.security.principals.{role}.{missing[0]}",
                                      f"the {role} of policy {missing[0]!r} has no principal: add it, or "
                                      f"{role!r} (every policy), or kafka.security.username")

    def client(self, role: str, config_dir: str = ".", file: str = "<dict>",
               policy: str | None = None) -> ClientSecurity:
        """The :class:`~astraflow.topics.security.ClientSecurity` of ``role``'s processes (its node
        serving ``policy``: principal ``<role>.<policy>`` when configured, else ``<role>``): its
        password read from its file or variable, relative paths taken from ``config_dir``;
        :class:`ConfigError` naming the key and ``file`` when one cannot be read."""
        k = self.principal_key(role, policy)
        p = self.principals[k] if k else None
        try:
            return self._client_security(file, "kafka.security", config_dir, ConfigError,
                                         f"kafka.security of {file}" + (f" (principal {k})" if p else ""),
                                         login=p, login_key=f"kafka.security.principals.{k}" if p else None)
        except SecurityError as e:
            raise ConfigError(file, "kafka.security", str(e)) from None


def install_security(cfg, role: str = "admin", policy: str | None = None) -> ClientSecurity:
    """Make ``kafka.security`` of job config ``cfg`` (as ``role``'s principal) the client setting
    of this process; a raas or trainer node serves ``policy`` (default ``cfg.policy``, a policy
    view's) and logs in as ``<role>.<policy>`` when configured, else as ``<role>``. A config
    without one leaves the environment's (``ASTRAFLOW_KAFKA_*``, else PLAINTEXT). Returns the
    setting now in force; :class:`ConfigError` when a password or TLS file named by the config
    cannot be read."""
    if cfg.kafka.security == KafkaSecurityConfig() or cfg.kafka.security.embedded:  # (the run makes the latter's)
        return security.current()
    policy = (policy or cfg.policy) if role in POLICY_ROLES else None
    return security.install(cfg.kafka.security.client(role, cfg.config_dir, cfg.source, policy=policy))
