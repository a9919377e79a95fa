"""The conservation audit a job runs by itself: at its end, and every ``audit.every_versions``.

``astraflow run`` and ``astraflow launch`` (:func:`astraflow.launcher.run_job`) call it. It
reads the job's topics with :mod:`astraflow.chaos.invariants` (every policy, and a
multi-policy job's episodes) and folds the reports into one :class:`Verdict`: ok or not,
the violations (the first :data:`MAX_LISTED`, and how many there were) and the counts
behind it. The verdict goes into ``summary.json`` (``audit``) and onto the run's done line
(:meth:`Verdict.line`); a failed one makes the command exit non-zero (:class:`AuditFailed`).

An audit of the running job (:class:`PeriodicAudit`, in a thread beside the launcher's
loop) judges only what no later record can repair (``Audit.definitive``: a group for a
task never scheduled, a group trained twice, ...), and such a finding stops the job; the
final audit judges everything, after waiting up to ``audit.settle_s`` for work still in
flight (``Audit.unsettled``) to settle.

It knows nothing of processes or of the progress display: the caller says when.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from astraflow.errors import FatalError

if TYPE_CHECKING:
    from astraflow.chaos.invariants import Audit
    from astraflow.config import JobConfig

log = logging.getLogger(__name__)

#: violations a verdict lists (summary.json, the error line); the count says how many more
MAX_LISTED = 20


class AuditFailed(FatalError):
    """The job's topics break the conservation law: the run exits non-zero (every run of the
    same records fails the same way, so it is fatal, not retriable)."""

    def __init__(self, verdict: "Verdict") -> None:
        self.verdict = verdict
        when = "the finished job" if verdict.final else f"the running job at v{verdict.version}"
        more = verdict.violation_count - 1
        super().__init__(f"the conservation audit of {when} failed: {verdict.violations[0]}"
                         + (f" (+{more} more violation(s))" if more else "")
                         + "; summary.json lists them under audit")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    final: bool  #: the audit of the finished job (else of the running one)
    version: int  #: newest version trained when it ran
    violation_count: int
    violations: tuple[str, ...]  #: the first MAX_LISTED, each naming its policy in a multi-policy job
    counts: dict[str, dict] = field(default_factory=dict)  #: per policy (and "episodes"): what it read
    audit_s: float = 0.0  #: how long reading and checking took

    def line(self) -> str:
        """The verdict as the run's last line says it."""
        if self.ok:
            c = [v for k, v in self.counts.items() if k != "episodes"]
            tasks = self.counts.get("episodes", {}).get("tasks") or sum(x["tasks"] for x in c)
            return (f"conservation audit ok ({tasks} tasks, {sum(x['batched_groups'] for x in c)} groups in "
                    f"{sum(x['batches'] for x in c)} batches, {sum(sum(x['drops'].values()) for x in c)} dropped)")
        return f"conservation audit FAILED: {self.violation_count} violation(s), first: {self.violations[0]}"

    def as_dict(self) -> dict:
        return asdict(self) | {"violations": list(self.violations)}

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        return cls(**{**d, "violations": tuple(d["violations"])})


def _reports(bootstrap: str, cfg: "JobConfig") -> dict[str, "Audit"]:
    from astraflow.chaos.invariants import audit, audit_job, content_limits, group_verifier
    from astraflow.topics import job_topics
    if len(cfg.policy_names) > 1:
        return audit_job(bootstrap, cfg)
    return {cfg.policy: audit(bootstrap, job_topics(cfg), cfg.policy, cfg.effective_staleness,
                              verifier=group_verifier(cfg), limits=content_limits(cfg))}


def audit_now(bootstrap: str, cfg: "JobConfig", *, final: bool, version: int) -> tuple[Verdict, bool]:
    """One audit; returns the verdict and whether waiting could change it (only work in
    flight was found, at the final audit)."""
    t0 = time.monotonic()
    reports = _reports(bootstrap, cfg)
    multi = len(reports) > 1
    found = [f"{name}: {v}" if multi else v
             for name, r in reports.items() for v in (r.violations if final else r.definitive)]
    pending = final and bool(found) and not any(r.definitive for r in reports.values())
    counts = {name: {"tasks": r.tasks, "groups": r.groups, "batches": r.batches, "batched_groups": r.batched_groups,
                     "replayed_groups": r.replayed_groups, "failed_groups": r.failed_groups, "drops": dict(r.drops),
                     "rejected_groups": dict(r.rejected_groups),
                     "max_staleness_seen": r.max_staleness_seen}
              for name, r in reports.items()}
    return Verdict(not found, final, version, len(found), tuple(found[:MAX_LISTED]), counts,
                   round(time.monotonic() - t0, 3)), pending


def final_audit(bootstrap: str, cfg: "JobConfig", version: int, interval_s: float = 2.0) -> Verdict:
    """The audit of a finished job: polled while only work in flight is found (a transaction
    a killed node left open blocks ``read_committed`` readers until the broker aborts it), at
    most ``cfg.audit.settle_s``. A topic that cannot be read fails the verdict: unaudited is
    not ok."""
    deadline = time.monotonic() + cfg.audit.settle_s
    while True:
        try:
            verdict, pending = audit_now(bootstrap, cfg, final=True, version=version)
        except Exception as e:  # noqa: BLE001 - the run still writes its summary, with this as the cause
            log.warning("the final audit could not read the topics", exc_info=True)
            return Verdict(False, True, version, 1, (f"the audit could not read the job's topics: "
                                                     f"{type(e).__name__}: {e}",))
        if not pending or time.monotonic() + interval_s > deadline:
            return verdict
        time.sleep(interval_s)


class PeriodicAudit:
    """Audits of the running job every ``cfg.audit.every_versions`` trained versions, one at a
    time in a thread (reading every topic takes seconds; the launcher's loop must go on)."""

    def __init__(self, bootstrap: str, cfg: "JobConfig") -> None:
        self.bootstrap, self.cfg, self.every = bootstrap, cfg, cfg.audit.every_versions
        self.next = self.every
        self.verdicts: list[Verdict] = []
        self._thread: threading.Thread | None = None

    def tick(self, trained: int) -> AuditFailed | None:
        """Collect a finished audit (its failure, to stop the job) and start the next one due."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
            failed = [v for v in self.verdicts if not v.ok]
            if failed:
                return AuditFailed(failed[0])
        if self.every and self._thread is None and trained >= self.next:
            self.next = (trained // self.every + 1) * self.every
            self._thread = threading.Thread(target=self._run, args=(trained,), name="audit", daemon=True)
            self._thread.start()
        return None

    def _run(self, version: int) -> None:
        try:
            self.verdicts.append(audit_now(self.bootstrap, self.cfg, final=False, version=version)[0])
        except Exception:  # noqa: BLE001 - a broker blip skips one audit of the running job; the final one counts
            log.warning("the audit at v%d could not read the topics; the next one or the final audit will", version,
                        exc_info=True)

    def finish(self, timeout_s: float = 120.0) -> AuditFailed | None:
        """Wait for the audit in flight; its failure, if it found one."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.tick(-1)


def audit_summary(final: Verdict | None, during: list[Verdict], skipped: str | None = None) -> dict:
    """``summary.json``'s ``audit``: ``ok`` (None when it did not run), the final verdict, the
    running job's verdicts, and why it was skipped."""
    ok = False if any(not v.ok for v in during) else (None if final is None else final.ok)
    return {"ok": ok, "final": final.as_dict() if final else None, "during": [v.as_dict() for v in during],
            **({"skipped": skipped} if skipped else {})}


def audit_line(summary: dict) -> str | None:
    """The audit's part of the run's last line (None when the summary has no audit)."""
    a = summary.get("audit")
    if not a:
        return None
    failed = [d for d in a.get("during", []) if not d["ok"]]
    if failed:
        return f"conservation audit FAILED at v{failed[0]['version']}: {failed[0]['violations'][0]}"
    if a.get("final"):
        return Verdict.from_dict(a["final"]).line()
    return f"conservation audit not run ({a.get('skipped', 'the job did not finish')})"
