"""``astraflow export --model``: any announced version of a policy, rebuilt from the log, as an HF directory.

The trainer announces every version on ``versions`` with the chain that leads to it: the
newest snapshot at or below it and every delta after that snapshot, each a chunked
payload on ``weights.<policy>``. :func:`rebuild_version` finds an announcement whose chain
holds the version asked for (the newest lineage epoch first: the job's surviving
history), loads the snapshot, applies the deltas up to the version and checks the result
against the digest the trainer gave for it, so what it returns is, bit for bit, what the
trainer published (``trainer.publish_dtype``). Compaction keeps only the latest
announcement of a policy and the publisher trims payloads before the previous snapshot,
so the versions the log can still rebuild are named in the error for one it cannot (the
run dir's own ``hf/<policy>/v<k>`` exports are the way to keep others).

:func:`export_model` writes those weights with the config and tokenizer of a base model
directory (the job's model, or one of the run's own exports). A LoRA policy's versions are
adapters (they name their base by digest, which must be the base directory's): its export
is peft's adapter directory, or with ``merged`` the base with the adapter merged in, a plain
HF model; either needs the policy's adapter settings (``trainer.engine.lora``: the job's
config, or the run's own adapter exports). Nothing is written to the
job's topics; signatures are not checked here (the digests are): an offline reader of a
run dir trusts the run dir.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from astraflow.engines.config import LoraConfig
from astraflow.replay.recorded import RecordError, check_job
from astraflow.topics import ChunkError, ChunkReader, JobTopics, VersionAnnouncement
from astraflow.topics.replay import read_topic

__all__ = ["RebuiltVersion", "export_model", "rebuild_version", "rebuildable_versions"]


@dataclass(frozen=True)
class RebuiltVersion:
    """One version's weights as the trainer published them."""

    version: int
    epoch: int
    digest: str  #: ``weights_digest`` of ``weights``: what the trainer announced for the version
    weights: dict[str, torch.Tensor]
    snapshot_version: int  #: the snapshot the chain started from
    base_model: str = ""  #: a LoRA policy's: the digest of the base its adapter applies to ("": full weights)


def _announcements(bootstrap: str, topics: JobTopics, policy: str) -> list[VersionAnnouncement]:
    """Every announcement of ``policy`` still on ``versions``, newest (epoch, version) first."""
    anns = [m for _, _, m in read_topic(bootstrap, topics.versions)
            if isinstance(m, VersionAnnouncement) and m.policy == policy]
    return sorted(anns, key=lambda a: (a.epoch, a.version), reverse=True)


def _chain(a: VersionAnnouncement) -> list[int]:
    return [a.snapshot_version, *a.delta_versions] if a.snapshot_manifest is not None else []


def rebuildable_versions(bootstrap: str, topics: JobTopics, policy: str) -> list[int]:
    """The versions whose chain an announcement still names (the payloads may yet be trimmed)."""
    return sorted({v for a in _announcements(bootstrap, topics, policy) for v in _chain(a)})


def rebuild_version(bootstrap: str, topics: JobTopics, policy: str, version: int | None = None,
                    threads: int = 1) -> RebuiltVersion:
    """Version ``version`` (None: the newest announced) of ``policy``, from snapshot + deltas;
    :class:`RecordError` naming what is missing when the log cannot rebuild it."""
    from astraflow.weights import codec

    check_job(bootstrap, topics, policy)
    anns = _announcements(bootstrap, topics, policy)
    if not anns:
        raise RecordError(f"job {topics.job!r} announced no version of policy {policy!r} on {topics.versions}")
    if version is None:
        version = anns[0].version
    holder = next((a for a in anns if version in _chain(a)), None)
    if holder is None:
        kept = sorted({v for a in anns for v in _chain(a)})
        raise RecordError(f"version {version} of {policy!r} is in no announced chain on {topics.versions} (the log "
                          f"can rebuild versions {_spans(kept)}); older versions were compacted away, keep them "
                          "with trainer.export_every (the run dir's hf/<policy>/v<k>)")
    chain = _chain(holder)
    steps = list(zip(holder.delta_versions, holder.deltas))[:chain.index(version)]
    what = f"version {version} of {policy!r} (snapshot {holder.snapshot_version}"
    what += f" + {len(steps)} deltas)" if steps else ")"
    try:
        with ChunkReader(bootstrap) as reader:
            payload = reader.read(holder.snapshot_manifest)
            header = codec.read_header(payload)
            _check_payload(header, holder.snapshot_version, "snapshot", what)
            state = codec.decode(payload, threads=threads)
            hashes = codec.tensor_hashes(state, threads)
            digest = header.digest
            del payload
            for dv, manifest in steps:
                payload = reader.read(manifest)
                header = codec.read_header(payload)
                _check_payload(header, dv, "delta", what)
                hashes = codec.apply_in_place(payload, state, base_hashes=hashes, threads=threads)
                digest = header.digest
                del payload
    except ChunkError as e:
        raise RecordError(f"{what}: a payload of its chain is gone from {holder.manifest.topic} ({e}); the log can "
                          "no longer rebuild it") from None
    except codec.WeightCodecError as e:
        raise RecordError(f"{what}: a payload of its chain does not apply: {e}") from None
    actual = codec.weights_digest(state, hashes)
    expected = holder.checksum if holder.version == version else digest
    if actual != expected:
        raise RecordError(f"{what} assembled with digest {actual[:16]}…, the trainer announced {expected[:16]}…")
    return RebuiltVersion(version, holder.epoch, actual, state, holder.snapshot_version, holder.base_model)


def _check_payload(header, version: int, kind: str, what: str) -> None:
    if header.version != version or header.kind.name.lower() != kind:
        raise RecordError(f"{what}: the {kind} announced for version {version} holds a "
                          f"{header.kind.name.lower()} of version {header.version}")


def _spans(vs: list[int]) -> str:
    if not vs:
        return "none"
    out, start, prev = [], vs[0], vs[0]
    for v in [*vs[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}" if start == prev else f"{start}..{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def export_model(bootstrap: str, job: str, policy: str, out: str | Path, *, base_model: str | Path,
                 version: int | None = None, lora: LoraConfig | None = None,
                 merged: bool = False) -> tuple[Path, RebuiltVersion]:
    """Rebuild ``version`` and write it into ``out`` (new, or an earlier export to replace)
    as an HF directory with ``base_model``'s config and tokenizer; for a LoRA policy (its
    settings ``lora``) peft's adapter directory, or with ``merged`` the merged model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from astraflow.engines.hf_export import export_hf_atomic

    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "config.json").exists()
                                              and not (out / "adapter_config.json").exists())):
        raise RecordError(f"--out {out} exists and is not an HF export; give a new directory")
    rebuilt = rebuild_version(bootstrap, JobTopics(job=job), policy, version)
    if rebuilt.base_model:
        return _export_adapter(rebuilt, policy, out, Path(base_model), lora, merged), rebuilt
    if merged:
        raise RecordError(f"export --merged: {policy!r} is not a LoRA policy (its versions are full weights, "
                          "already a whole model): leave --merged out")
    try:
        config = AutoConfig.from_pretrained(str(base_model))
    except (OSError, ValueError) as e:
        raise RecordError(f"base model {base_model}: not an HF model directory ({type(e).__name__}: {e})") from None
    with torch.device("meta"):  # only its config and class are used: the weights are ours
        module = AutoModelForCausalLM.from_config(config)
    missing = sorted(set(module.state_dict()) - set(rebuilt.weights))
    if missing:
        raise RecordError(f"base model {base_model} does not fit the job's weights: it has tensors the job's do not "
                          f"({', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}); give the job's model")
    return export_hf_atomic(out, module, rebuilt.weights, base_model), rebuilt


def _export_adapter(rebuilt: RebuiltVersion, policy: str, out: Path, base_model: Path, lora: LoraConfig | None,
                    merged: bool) -> Path:
    """A LoRA policy's version out: peft's adapter directory, or (``merged``) the merged model."""
    from astraflow.engines.hf_export import export_adapter, export_merged
    from astraflow.weights.adapters import base_digest

    what = f"version {rebuilt.version} of {policy!r}"
    if lora is None:
        raise RecordError(f"{what} is a LoRA adapter, and its settings (trainer.engine.lora: rank, alpha, targets) "
                          "are not in the log: give --config (the job's config file)")
    try:
        digest = base_digest(base_model)
    except FileNotFoundError as e:
        raise RecordError(f"base model {base_model}: {e}") from None
    if digest != rebuilt.base_model:
        raise RecordError(f"{what} is a LoRA adapter of base {rebuilt.base_model[:16]}…, and {base_model} is "
                          f"{digest[:16]}… (another model): give the job's model as --base-model")
    if not merged:
        return export_adapter(out, lora, rebuilt.weights, base_model)
    try:
        return export_merged(out, lora, rebuilt.weights, base_model)
    except ValueError as e:
        raise RecordError(f"{what}: {e}") from None


def _sources(args, policy: str) -> tuple[Path, LoraConfig | None]:
    """The HF dir whose config and tokenizer an export carries (see ``--base-model``), and a
    LoRA policy's adapter settings (None: a full-weights policy, or none known)."""
    config = args.config
    run = Path(args.run_dir_log) if getattr(args, "run_dir_log", None) else None
    if run is not None and not config:
        from astraflow.engines.hf_export import HFExports
        exports = HFExports(run / "hf" / policy)
        done = exports.final() or next((exports.path(v) for v in reversed(exports.versions())), None)
        if done is not None and (done / "adapter_config.json").is_file():  # the trainer's adapter export
            lora, base = _adapter_settings(done / "adapter_config.json")
            return Path(args.base_model or base), lora
        if done is not None and not args.base_model:
            return done, None
        try:
            import json
            config = json.loads((run / "summary.json").read_text()).get("config")
        except (OSError, ValueError):
            config = None
    if not config:
        if args.base_model:
            return Path(args.base_model), None
        raise RecordError("export --model: give --base-model (the job's HF model dir) or --config (the job's config "
                          "file): the weights topic holds the weights, not the model's config or tokenizer")

    from astraflow.actors.common import model_path
    from astraflow.config import load_config
    cfg = load_config(config)
    view = cfg.view(policy) if policy in cfg.policy_names else cfg
    return Path(args.base_model) if args.base_model else model_path(view), view.trainer.engine.lora


def _adapter_settings(path: Path) -> tuple[LoraConfig, str]:
    """The LoRA settings and base model an ``adapter_config.json`` (peft's) names."""
    import json

    try:
        c = json.loads(path.read_text())
        targets = c["target_modules"]
        return (LoraConfig(rank=int(c["r"]), alpha=float(c["lora_alpha"]), dropout=float(c.get("lora_dropout") or 0),
                           target_modules=tuple(targets if isinstance(targets, list) else sorted(targets))),
                str(c.get("base_model_name_or_path") or ""))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RecordError(f"{path}: not a peft adapter config ({type(e).__name__}: {e})") from None


def cli_export_model(args) -> int:
    """``astraflow export --model``: print where the model went; 0 on success."""
    from astraflow.replay.recorded import policies
    topics = JobTopics(job=args.job)
    if args.policy and len(args.policy) > 1:
        raise RecordError("export --model: give one --policy (a model is one policy's weights)")
    policy = args.policy[0] if args.policy else None
    if policy is None:
        check_job(args.bootstrap_servers, topics, None)
        found = policies(args.bootstrap_servers, topics)
        if len(found) != 1:
            raise RecordError(f"export --model: job {args.job!r} has policies {', '.join(found) or 'none'}; "
                              "pass --policy")
        policy = found[0]
    base, lora = _sources(args, policy)
    out, rebuilt = export_model(args.bootstrap_servers, args.job, policy, args.out, base_model=base,
                                version=args.version, lora=lora, merged=args.merged)
    deltas = rebuilt.version - rebuilt.snapshot_version
    print(f"exported version {rebuilt.version} of {policy} (epoch {rebuilt.epoch}, snapshot {rebuilt.snapshot_version}"
          + (f" + {deltas} delta{'s' * (deltas > 1)}" if deltas else "")
          + f", digest {rebuilt.digest[:16]}…) as "
          + ("a Hugging Face model" if not rebuilt.base_model else "the base with the LoRA adapter merged in"
             if args.merged else "a PEFT adapter directory") + f": {out}")
    return 0
