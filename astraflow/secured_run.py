"""A run's own secured embedded broker (``kafka.security.embedded: true``).

It owns the run dir's ``secure/`` (mode 0700): the broker's CA, key and super user's password
(:class:`~astraflow.topics.secured.SecureSetup`) and in ``secure/users/`` one password file
(0600) per principal of the job — ``admin``, ``dataflow`` and, per policy, ``raas.<p>`` and ``trainer.<p>`` — then the
SCRAM users made for them and the ACLs ``astraflow acl plan`` lists for them. It does not start
the broker or the components: the launcher does, with the job config and ``--set`` overrides
this module returns, so every component logs in as its own principal under only its ACLs.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from astraflow.config import POLICY_ROLES, JobConfig, KafkaPrincipal, KafkaSecurityConfig
from astraflow.topics.secured import MECHANISM, SecureSetup, add_users, new_password

__all__ = ["SecuredRun", "principal_users"]


def principal_users(cfg: JobConfig) -> dict[str, str]:
    """Principal key -> SCRAM user: one per policy for the roles that serve one, so a RaaS node
    of ``a`` cannot read ``b``'s tasks nor a trainer of ``a`` write ``weights.b``."""
    users = {"admin": "af-admin", "dataflow": "af-dataflow"}
    for role in POLICY_ROLES:
        users.update({f"{role}.{p}": f"af-{role}-{p}" for p in cfg.policy_names})
    return users


@dataclasses.dataclass
class SecuredRun:
    """The secured setting of one run, made in ``run_dir/secure`` (kept across a restart of the
    same run dir: the broker's storage holds these users)."""

    setup: SecureSetup
    users: dict[str, str]  #: principal key -> SCRAM user
    password_files: dict[str, Path]  #: principal key -> its password file

    @classmethod
    def create(cls, cfg: JobConfig, run_dir: Path) -> "SecuredRun":
        setup = SecureSetup.create(Path(run_dir) / "secure")
        users, files = principal_users(cfg), {}
        folder = setup.dir / "users"  # (apart from the super user's admin.password beside the CA)
        folder.mkdir(mode=0o700, exist_ok=True)
        for key in users:
            path = folder / f"{key}.password"
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(new_password() + "\n")
            files[key] = path.resolve()
        return cls(setup, users, files)

    def security(self) -> KafkaSecurityConfig:
        """The job's ``kafka.security`` on this run's broker."""
        return KafkaSecurityConfig(protocol="SASL_SSL", sasl_mechanism=MECHANISM, ca_file=str(self.setup.ca_file.resolve()),
                                   principals={k: KafkaPrincipal(username=u, password_file=str(self.password_files[k]))
                                               for k, u in self.users.items()})

    def job_config(self, cfg: JobConfig) -> JobConfig:
        return dataclasses.replace(cfg, kafka=dataclasses.replace(cfg.kafka, security=self.security()))

    def overrides(self) -> list[str]:
        """``--set`` pairs giving a component the same setting (file names only, never a password)."""
        out = ["kafka.security.embedded=false", "kafka.security.protocol=SASL_SSL",
               f"kafka.security.sasl_mechanism={MECHANISM}", f"kafka.security.ca_file={self.setup.ca_file.resolve()}"]
        for key, user in self.users.items():
            out += [f"kafka.security.principals.{key}.username={user}",
                    f"kafka.security.principals.{key}.password_file={self.password_files[key]}"]
        return out

    def grant(self, bootstrap: str, cfg: JobConfig) -> int:
        """As the super user (the installed client setting): make every principal's SCRAM user and
        apply the planned ACLs; the number of ACLs in force."""
        from astraflow.topics import job_topics
        from astraflow.topics.acls import apply, plan
        add_users(bootstrap, {u: self.password_files[k].read_text().strip() for k, u in self.users.items()})
        return apply(bootstrap, plan(job_topics(cfg), self.users))
