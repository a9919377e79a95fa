"""The checks of a job config that span its sections, run once every section has loaded.

:class:`CrossSectionChecks` is mixed into :class:`~astraflow.config.job.JobConfig`, whose
``__post_init__`` runs :meth:`~CrossSectionChecks.check_sections`: names that become topic and
path parts, the data-algorithm pipeline of each policy (its batch and group sizes), the
workflow and its role -> policy binding, the evaluation keys against the data sources, each
policy's model, the pools shared by LoRA policies, device sharing, and the principals of each policy. Each failure is a
:class:`ConfigError` naming the dotted key and the file. The checks read the job's sections
and its policy properties (``policy_names``, ``role_policies``, ...); they know nothing of
how a file becomes a job config (:mod:`.job`), nor of what runs the job.
"""

from __future__ import annotations

from astraflow.algorithms.pipeline import PipelineError, build_pipeline, context_for, context_of, is_curator
from astraflow.models.pretrained import CATALOGUE
from astraflow.models.warm_start import WarmStartError, get_task
from astraflow.typed_config import ConfigError, check_name
from astraflow.workflows.api import WorkflowParamError, get_reward, get_workflow
from astraflow.workflows.user_modules import import_user_module

from .sections import GENERATORS


class CrossSectionChecks:
    """What a job config checks across its sections (a mixin of ``JobConfig``)."""

    def check_sections(self) -> None:
        """Every cross-section check, in order; :class:`ConfigError` on the first failure."""
        self._check_names()
        # the data algorithms against the batch and group sizes, at load time
        try:
            build_pipeline(self.dataflow.algorithms, context_of(self), self.dataflow.force_after_skips)
        except PipelineError as e:
            raise ConfigError(self.source, f"dataflow.{e.key}", e.problem) from None
        self._check_workflow()
        self._check_eval()
        self._check_models()
        self._check_shared_pools()
        self._check_shared_trainers()
        self._check_device_shares()
        self.kafka.security.check_policies(self.policy_names, self.source)

    def _check_names(self) -> None:
        """Names that become parts of Kafka topic names (af.<job>.tasks.<policy>, ...) and of
        paths (<run_dir>/<job>-<time>, checkpoint and weight dirs per policy): refused here,
        not by the broker or the file system once the components are already starting."""
        for key, name in (("job", self.job), *((f"policies.{p}", p) for p in self.policies), ("policy", self.policy)):
            problem = check_name(name)
            if problem:
                raise ConfigError(self.source, key, problem)

    def _check_workflow(self) -> None:
        """The user's module imports, the workflow and its reward are registered, its parameters
        pass its own check, and its roles and the job's policies are bound one to another."""
        if self.workflow.module:
            try:
                import_user_module(self.workflow.module, self.source)
            except Exception as e:  # noqa: BLE001 - the user's module: any error it raises is a config error
                raise ConfigError(self.source, "workflow.module",
                                  f"cannot import {self.workflow.module!r}: {type(e).__name__}: {e}") from None
        try:
            spec = get_workflow(self.workflow.name)
        except KeyError as e:
            raise ConfigError(self.source, "workflow.name", str(e.args[0])) from None
        if "reward" in self.workflow.params:  # the built-in workflows score with the reward it names
            try:
                get_reward(str(self.workflow.params["reward"]))
            except KeyError as e:
                raise ConfigError(self.source, "workflow.params.reward", str(e.args[0])) from None
        if spec.check is not None:
            try:  # with the file's path: user code the params name is found beside it, as workflow.module is
                spec.check({**self.workflow.params, "_config": self.source})
            except WorkflowParamError as e:
                raise ConfigError(self.source, f"workflow.params.{e.key}", e.message) from None
        names = self.policy_names
        if self.policies and self.policy not in self.policies:
            raise ConfigError(self.source, "policy", f"{self.policy!r} is not one of policies ({', '.join(names)})")
        bound = self.role_policies
        for role in spec.roles:
            if role not in bound:
                raise ConfigError(self.source, f"workflow.roles.{role}",
                                  f"workflow {spec.name!r} calls role {role!r}: bind it to one of the policies "
                                  f"({', '.join(names)})")
        for role, policy in bound.items():
            if role not in spec.roles:
                raise ConfigError(self.source, f"workflow.roles.{role}",
                                  f"workflow {spec.name!r} has no role {role!r} (its roles: {', '.join(spec.roles)})")
            if policy not in names:
                raise ConfigError(self.source, f"workflow.roles.{role}",
                                  f"no policy {policy!r} (policies: {', '.join(names)})")
        if len(names) > 1:
            self._check_policy_algorithms(names)
        idle = [p for p in names if p not in bound.values()]
        if idle:
            raise ConfigError(self.source, f"policies.{idle[0]}", "no workflow role is bound to this policy: it "
                                                                  "would never get data (workflow.roles)")

    def _check_policy_algorithms(self, names) -> None:
        """Each policy's lane runs its own data algorithms (filters and composers on its own
        groups, checked against its own batch and group sizes). Prompt curators choose the
        prompts the team's episodes run on, once for every policy: the lead policy's run (they
        learn from its groups); a non-lead policy may repeat them (inherited from the top-level
        ``dataflow`` section; its lane skips them), never add or change one."""
        lead = self.lead_policy
        lead_curators = [s for s in self.policies[lead].dataflow.algorithms if is_curator(s)]
        for p in names:
            section = self.policies[p]
            specs = section.dataflow.algorithms
            # the policy view's context, from its sections: a view is a JobConfig and would run
            # these checks again
            ctx = context_for(self.seed, section.dataflow, section.rollout,
                              0 if self.mode == "sync" else section.dataflow.max_staleness)
            try:
                build_pipeline(specs, ctx, section.dataflow.force_after_skips)
            except PipelineError as e:
                raise ConfigError(self.source, f"policies.{p}.dataflow.{e.key}", e.problem) from None
            if p == lead:
                continue
            for i, s in enumerate(specs):
                if is_curator(s) and s not in lead_curators:
                    raise ConfigError(self.source, f"policies.{p}.dataflow.algorithms[{i}]",
                                      f"{s.name} is a prompt curator: curators choose the prompts every policy's "
                                      f"episodes run on, once for the team, so they belong to the lead policy "
                                      f"{lead!r} (the one playing the workflow's first role; they learn from its "
                                      f"groups); {p!r} may run filters and composers of its own")

    def _check_eval(self) -> None:
        ev, files = self.eval, [s for s in self.data_sources if s not in GENERATORS]
        if ev.data is not None:
            if ev.data in GENERATORS or not ev.data.strip():
                raise ConfigError(self.source, "eval.data", f"expected a JSONL or Parquet file of held-out rows, got "
                                                            f"{ev.data!r} (the generators hold out a split of "
                                                            f"their own: leave eval.data null)")
            if ev.holdout:
                raise ConfigError(self.source, "eval.holdout", "set either eval.holdout (a split of the training "
                                                               "file) or eval.data (a held-out file), not both")
        elif ev.holdout is not None and not files:
            raise ConfigError(self.source, "eval.holdout", f"data.source {self.data.source!r} is a generator with a "
                                                           f"held-out split of its own; eval.holdout splits a "
                                                           f"dataset file (leave it null)")
        elif ev.holdout == 0 and files and len(files) == len(self.data_sources):  # no generator's split either
            raise ConfigError(self.source, "eval.holdout", "0 holds no rows out and eval.data is null: nothing "
                                                           "would be evaluated; set eval.holdout > 0 or eval.data")

    def _check_device_shares(self) -> None:
        """``device.share``: one policy's single pool node and its trainer, or the trainers of
        LoRA policies of one base (one trainer training each adapter in turn), on the same count
        of the same profile's devices (emulation/share.py); the evaluator shares nothing."""
        if self.eval.device.share:
            raise ConfigError(self.source, "eval.device.share", "the evaluator runs on devices of its own")
        named: dict[str, list[tuple[str, str, object, str]]] = {}  # share -> (policy, stage, device, key)
        for p in self.policy_names:
            where = f"policies.{p}." if self.policies else ""
            sec = self.policies[p] if self.policies else self
            for stage, dev in (("rollout", sec.rollout.device), ("trainer", sec.trainer.device)):
                if not dev.share:
                    continue
                key = f"{where}{stage}.device.share"
                if stage == "rollout" and sec.rollout.nodes != 1:
                    raise ConfigError(self.source, key, f"{sec.rollout.nodes} RaaS nodes cannot take turns on one "
                                                        f"trainer's devices (rollout.nodes must be 1)")
                named.setdefault(dev.share, []).append((p, stage, dev, key))
        for name, users in named.items():
            first, last = users[0], users[-1]
            if len(users) == 1:
                raise ConfigError(self.source, first[3], f"{name!r} is named by this component only: a pool and its "
                                                         f"policy's trainer share devices, both naming them (or the "
                                                         f"trainers of LoRA policies of one base)")
            if any(stage == "rollout" for _, stage, _, _ in users):
                if len(users) > 2 or first[0] != last[0]:
                    raise ConfigError(self.source, last[3], f"{name!r} is policy {first[0]!r}'s: a pool shares its "
                                                            f"devices with its own policy's trainer only")
            else:
                self._check_trainers_share(name, users)
            for _, _, dev, key in users[1:]:
                odev = first[2]
                if (odev.count, odev.profile) != (dev.count, dev.profile):
                    raise ConfigError(self.source, key, f"the components sharing {name!r} must name the same devices "
                                                        f"(count and profile), got {odev.count} x {odev.profile} and "
                                                        f"{dev.count} x {dev.profile}")

    def _check_trainers_share(self, name: str, users: list[tuple[str, str, object, str]]) -> None:
        """Trainers alone on one share: each a LoRA policy, all of one base model."""
        base = self.policies[users[0][0]].model if self.policies else self.model
        for p, _, _, key in users:
            sec = self.policies[p] if self.policies else self
            if sec.trainer.engine.lora is None:
                raise ConfigError(self.source, key, f"trainers share devices ({name!r}) as LoRA adapters of one base "
                                                    f"only (their states stay side by side), and {p!r} is full "
                                                    f"fine-tuning")
            if sec.model != base:
                raise ConfigError(self.source, key, f"trainers sharing {name!r} train adapters of one base, and {p!r} is "
                                                    f"on {_model_name(sec.model)}, {users[0][0]!r} on "
                                                    f"{_model_name(base)}")

    def _naming_another(self, section: str, field: str, what: str, single: str):
        """``(policy, its section, the policy named, the key)`` for each policy whose
        ``<section>.<field>`` names another policy (``rollout.pool``, ``trainer.process``);
        refused: naming one in a single-policy job (which has ``single``), or no such policy."""
        for p in self.policy_names:
            own = self.policies[p] if self.policies else self
            other = getattr(getattr(own, section), field)
            if other is None or other == p:
                continue
            key = f"policies.{p}.{section}.{field}" if self.policies else f"{section}.{field}"
            if not self.policies:
                raise ConfigError(self.source, key, f"names {what} {other!r}, and a single-policy job has {single} "
                                                    f"(leave it null)")
            if other not in self.policies:
                raise ConfigError(self.source, key, f"no policy {other!r} (policies: {', '.join(self.policy_names)})")
            yield p, own, other, key

    def _adapters_of_one_base(self, key: str, what: str, p: str, own, q: str, other) -> None:
        """Policies ``p`` and ``q`` (with their sections) are LoRA policies (``trainer.engine.lora``)
        of the same model, as ``what`` (a shared pool, one trainer process) needs."""
        for who, sec in ((p, own), (q, other)):
            if sec.trainer.engine.lora is None:
                raise ConfigError(self.source, key, f"{what} holds LoRA adapters of one base, and {who!r} is full "
                                                    f"fine-tuning (set policies.{who}.trainer.engine.lora)")
        if own.model != other.model:
            raise ConfigError(self.source, key, f"{what} holds adapters of one base model, and {p!r} is on "
                                                f"{_model_name(own.model)} while {q!r} is on {_model_name(other.model)} "
                                                f"(policies.<p>.model must be the same)")

    def _check_shared_pools(self) -> None:
        """``rollout.pool``: a policy whose rows another policy's pool serves. That pool is the
        lead's (its nodes run the episodes, so the other roles are played there), and every
        policy on it is a LoRA adapter of the same base model on the pool's engine (one CPU
        engine or SGLang server holds the base once and serves each policy's adapter per row),
        on the pool's devices (emulated ones included: one emulated device prices every
        adapter's rows and loads)."""
        for p, own, pool, key in self._naming_another("rollout", "pool", "pool", "one pool of its own"):
            lead = self.lead_policy
            if pool != lead:
                raise ConfigError(self.source, key, f"{pool!r}'s pool runs no episodes: only the lead policy {lead!r}'s "
                                                    f"pool (it plays the workflow's first role) plays other policies' "
                                                    f"roles, so a shared pool is {lead!r}'s")
            host = self.policies[pool]
            self._adapters_of_one_base(key, "a shared pool", p, own, pool, host)
            if own.rollout.engine.kind != host.rollout.engine.kind:
                raise ConfigError(self.source, f"policies.{p}.rollout.engine.kind",
                                  f"{p!r}'s rows run on {pool!r}'s pool, so on its engine ({host.rollout.engine.kind}, "
                                  f"which mixes both adapters' rows in one call); this says {own.rollout.engine.kind}: "
                                  f"leave it unset or make it {pool!r}'s")
            if own.rollout.device != host.rollout.device:
                raise ConfigError(self.source, f"policies.{p}.rollout.device",
                                  f"{p!r}'s rows run on {pool!r}'s pool, so on its devices "
                                  f"({host.rollout.device.kind}); this says {own.rollout.device.kind}: "
                                  f"leave it unset or make it {pool!r}'s")

    def _check_shared_trainers(self) -> None:
        """``trainer.process``: a policy trained in another policy's trainer process. Both are
        LoRA adapters of the same base model (the process holds it once), the host trains only
        its own and hosted policies (no chains), and each trainer is one rank with ZeRO 0-2
        (stage 3 would shard the shared base)."""
        for p, own, host_name, key in self._naming_another("trainer", "process", "trainer process", "one trainer"):
            host = self.policies[host_name]
            if host.trainer.process not in (None, host_name):
                raise ConfigError(self.source, key, f"{host_name!r} is itself trained in {host.trainer.process!r}'s "
                                                    f"process: name that one")
            self._adapters_of_one_base(key, "one trainer process", p, own, host_name, host)
            for who, sec in ((p, own), (host_name, host)):
                if sec.trainer.ranks != 1 or sec.trainer.engine.zero_stage == 3:
                    raise ConfigError(self.source, key, f"one trainer process holds the base once, unsharded: "
                                                        f"{who!r} has trainer.ranks {sec.trainer.ranks} and zero_stage "
                                                        f"{sec.trainer.engine.zero_stage} (1 rank and ZeRO 0-2 needed)")

    def _check_models(self) -> None:
        """Each policy's tiny bootstrapped model is one that ``astraflow model init`` can build;
        a LoRA policy's engine serves adapters."""
        for p in self.policy_names:
            where = f"policies.{p}.model" if self.policies else "model"
            own = self.policies[p] if self.policies else self  # (a view would check itself again)
            model = own.model
            if own.trainer.engine.lora is not None and own.rollout.partial:
                key = f"policies.{p}.rollout.partial" if self.policies else "rollout.partial"
                raise ConfigError(self.source, key, "a LoRA policy's engine loads its adapters between calls only: "
                                                    "partial rollouts need full fine-tuning (trainer.engine.lora: null)")
            if model.name:
                if model.path:
                    raise ConfigError(self.source, f"{where}.name", f"names a pretrained model ({model.name}) and "
                                                                    f"{where}.path a directory ({model.path}): set one")
                if model.name not in CATALOGUE:
                    raise ConfigError(self.source, f"{where}.name", f"unknown pretrained model {model.name!r}; "
                                                                    f"known: {', '.join(sorted(CATALOGUE))}")
            if self.data.chat_template == "on" and not (model.path or model.name):
                raise ConfigError(self.source, "data.chat_template", f"is on, but {where} is the tiny bootstrapped "
                                                                     f"model, which has no chat template (name a "
                                                                     f"chat model in {where}.name or .path)")
            if model.path or model.name:
                if model.max_positions is not None:
                    raise ConfigError(self.source, f"{where}.max_positions",
                                      f"sets the window of the tiny bootstrapped model, but {where}."
                                      f"{'path' if model.path else 'name'} is set ({model.path or model.name}): "
                                      f"its config.json declares its own positions (leave it null)")
                continue
            try:
                get_task(model.task)
            except WarmStartError as e:
                raise ConfigError(self.source, f"{where}.task", str(e)) from None


def _model_name(model) -> str:
    return model.path or model.name or f"the tiny {model.task} model (seed {model.seed})"
