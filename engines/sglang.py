"""SGLang rollout engine: an SGLang server subprocess behind the ``RolloutEngine`` API.

Owns the server's lifecycle (``python -m sglang.launch_server`` in its own process group,
health wait, clean stop) and the HTTP calls the RL loop needs:

* ``POST /generate`` with ``input_ids``, ``sampling_params`` and ``return_logprob``;
* ``POST /update_weights_from_disk`` (the node writes a safetensors copy of the new
  weights next to the base model's config and tokenizer) or
  ``POST /update_weights_from_tensor`` (same-host tensor handles, needs ``sglang``
  importable here), each with ``weight_version`` so the server reports it;
* ``POST /pause_generation`` / ``POST /continue_generation`` around a refresh (mode
  ``retract``; ``abort`` with partial rollouts, whose rows are then sent again);
* ``GET /model_info`` (``weight_version``; older servers: ``/get_model_info``);
* a LoRA policy: the server runs with ``--enable-lora``; each version is written as peft's
  adapter directory and loaded with ``POST /load_lora_adapter`` (``lora_name`` ``v<N>``), the
  one before it unloaded with ``POST /unload_lora_adapter``; rows name it in ``lora_path``;
* a shared pool (``adapters``: several LoRA policies of one base): one server, each policy's
  versions loaded as ``<policy>-v<N>``, and one ``/generate`` holding rows of several adapters,
  each row naming its own in ``lora_path`` (``None``: the base, an adapter's version 0).

Stop strings go as ``stop`` and stop token ids as ``stop_token_ids``, with ``no_stop_trim``
so the tokens that spell a stop stay in the output as on the CPU engine. The context guard
is applied here, before the server sees a row: each row's ``max_new_tokens`` is clipped to
what fits in the model's ``max_position_embeddings`` (read from its ``config.json``) and a
row whose prompt alone fills them is answered ``"context"`` without a token.

Only the standard library is used for HTTP, so this module imports without ``sglang``
installed (the ``gpu`` extra). The CPU test suite runs it against a stub that
implements exactly these request/response shapes (``tests/engines/sglang_stub.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from .base import (AdapterEngine, Generation, NamedTensors, RolloutEngine, SamplingParams, context_budgets,
                   finish_of, iter_named_tensors, out_of_context, row_adapters, row_seeds)
from .config import LoraConfig, SGLangConfig
from .lora import is_adapter_name
from .sglang_wire import SGLangError, parse_generation, parse_item, sampling_params_json, serialize_for_tensor_update

__all__ = ["SGLangEngine", "SGLangError", "sampling_params_json", "parse_generation", "parse_item"]

#: partial rollouts: how often a call in flight asks for newer weights
REFRESH_S = 0.05

# Files of the base model a disk update directory needs besides the weights.
_MODEL_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "special_tokens_map.json")


class SGLangEngine(RolloutEngine):
    """Rollout through one SGLang server (launched here unless ``cfg.url`` is set)."""

    def __init__(self, model_path: str | Path, cfg: SGLangConfig | None = None, version: int = 0,
                 lora: LoraConfig | None = None, adapters: Mapping[str, LoraConfig] | None = None) -> None:
        """``lora``: the policy is a LoRA adapter of ``model_path`` (the base): the server is
        launched with LoRA serving on, each version is loaded as a named adapter
        (``/load_lora_adapter``, the one before it unloaded) and every row names it.
        ``adapters``: several adapters of ``model_path`` by name (a shared pool: policy -> its
        LoRA settings), each at its own version (:meth:`adapter`, :meth:`load_adapter`)."""
        if lora is not None and adapters:
            raise ValueError("SGLangEngine: give lora (one adapter) or adapters (several by name), not both")
        self.cfg = cfg or SGLangConfig()
        self.lora = lora
        #: adapter name -> its LoRA settings ("": the policy's own, with ``lora``)
        self._loras: dict[str, LoraConfig] = {"": lora} if lora is not None else dict(adapters or {})
        #: adapter name -> the server's name of the version its rows use (absent: the base, as at version 0)
        self._served: dict[str, str] = {}
        self._adapter_versions = {name: version for name in self._loras}
        self.model_path = Path(model_path)
        self._version = version
        self._proc: subprocess.Popen | None = None
        self._log_path: Path | None = None
        self._weights_root = Path(self.cfg.weights_dir) if self.cfg.weights_dir else Path(tempfile.mkdtemp(prefix="af-sglang-w-"))
        self._own_weights_root = not self.cfg.weights_dir
        #: the model's context window (config.json's max_position_embeddings; None: unknown)
        self.max_positions = _max_positions(self.model_path)
        self._refresh: Callable[[], object] | None = None  #: partial rollouts (set_weight_refresh)
        self._max_versions = 0
        #: a load and a request's submission never interleave (a request sent while paused would be refused)
        self._loading = threading.RLock()
        self._calls = ThreadPoolExecutor(4, thread_name_prefix="sglang-call")
        self.refreshes = {"rows": 0, "recomputed_tokens": 0}
        if self.cfg.url:
            self.base_url = self.cfg.url.rstrip("/")
        else:
            port = self.cfg.port or _free_port(self.cfg.host)
            self.base_url = f"http://{self.cfg.host}:{port}"
            self._launch(port)
        try:
            self._wait_healthy(self.cfg.startup_timeout_s)
        except BaseException:
            self.close()
            raise

    # --- RolloutEngine -----------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def set_weight_refresh(self, refresh: Callable[[], object] | None, max_versions: int = 0) -> None:
        """Partial rollouts through SGLang's pause in **abort** mode. While a ``/generate`` is in
        flight, the calling thread calls ``refresh`` every ``REFRESH_S``; a load it makes pauses
        the server with ``mode: abort`` — the rows in flight come back at once with the tokens
        they have (``finish_reason.type == "abort"``), all generated under the old version —
        then updates the weights and continues. The unfinished rows are sent again as prompt +
        tokens so far with the rest of their budget, under the new version; the server's prefix
        cache was flushed by the update, so their KV is recomputed as on the CPU engine. Each
        token keeps the version of the request that produced it. ``max_versions``: as
        ``RolloutEngine.set_weight_refresh``."""
        if max_versions < 0:
            raise ValueError(f"max_versions must be >= 0 (0: no bound), got {max_versions}")
        self._refresh, self._max_versions = refresh, max_versions

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None, adapters: Sequence[str] | None = None) -> list[Generation]:
        """``adapters`` (a host of several adapters): the adapter of each row (default: the first)."""
        if not prompts:
            return []
        names = self._row_adapters(adapters, len(prompts))
        if self._refresh is not None:
            return self._generate_partial(prompts, params, seeds, names)
        base = sampling_params_json(params)
        seeds = row_seeds(prompts, params, seeds)
        budgets = context_budgets(prompts, params.max_new_tokens, self.max_positions)
        fits = [i for i, b in enumerate(budgets) if b > 0]
        out: list[Generation | None] = [None if b > 0 else out_of_context(prompts[i], self._row_version(names[i]))
                                        for i, b in enumerate(budgets)]
        if not fits:
            return out  # type: ignore[return-value]
        rows = [prompts[i] for i in fits]
        if (self.cfg.send_seed and seeds is not None) or any(budgets[i] != params.max_new_tokens for i in fits):
            sampling: dict | list = [dict(base, max_new_tokens=budgets[i],
                                          **({"sampling_seed": seeds[i]} if self.cfg.send_seed and seeds is not None
                                             else {}))
                                     for i in fits]
        else:
            sampling = base
        with self._loading:  # the adapters named and the versions recorded are the same ones
            body = {"input_ids": [list(map(int, p)) for p in rows], "sampling_params": sampling,
                    "return_logprob": True, **self._adapter_field([names[i] for i in fits])}
            versions = {i: self._row_version(names[i]) for i in fits}
        answer = self._post("/generate", body)
        if not isinstance(answer, list) or len(answer) != len(rows):
            raise SGLangError(f"/generate returned {type(answer).__name__} of length "
                              f"{len(answer) if isinstance(answer, list) else '-'} for {len(rows)} prompts")
        for i, item in zip(fits, answer):
            g = parse_generation(prompts[i], item, versions[i])
            reason = finish_of(g.finish_reason, budgets[i], params)
            out[i] = g if reason == g.finish_reason else Generation(g.prompt_ids, g.tokens, g.logprobs, reason,
                                                                    g.version)  # type: ignore[arg-type]
        return out  # type: ignore[return-value]

    def _generate_partial(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                          seeds: Sequence[int] | None, names: list[str | None]) -> list[Generation]:
        """``generate`` with partial rollouts (see :meth:`set_weight_refresh`)."""
        base = sampling_params_json(params)
        seeds = row_seeds(prompts, params, seeds)
        budgets = context_budgets(prompts, params.max_new_tokens, self.max_positions)
        rows = {i: {"tokens": [], "logprobs": [], "versions": [], "finish": None}
                for i, b in enumerate(budgets) if b > 0}
        empty_aborts = 0
        while live := [i for i, r in rows.items() if r["finish"] is None]:
            sampling = [dict(base, max_new_tokens=budgets[i] - len(rows[i]["tokens"]),
                             **({"sampling_seed": seeds[i]} if self.cfg.send_seed and seeds is not None else {}))
                        for i in live]
            with self._loading:  # never between a load's pause and its continue, nor naming an unloaded adapter
                body = {"input_ids": [list(map(int, prompts[i])) + rows[i]["tokens"] for i in live],
                        "sampling_params": sampling, "return_logprob": True,
                        **self._adapter_field([names[i] for i in live])}
                version = {i: self._row_version(names[i]) for i in live}
                call = self._calls.submit(self._post, "/generate", body)
            spans = [len(set(rows[i]["versions"]) | {version[i]}) for i in live]  # with this request's version
            while True:
                try:
                    answer = call.result(timeout=REFRESH_S)
                    break
                except FutureTimeout:
                    if not self._max_versions or max(spans) < self._max_versions:
                        self._refresh()
            if not isinstance(answer, list) or len(answer) != len(live):
                raise SGLangError(f"/generate returned {type(answer).__name__} for {len(live)} prompts")
            got = 0
            for i, item in zip(live, answer):
                tokens, logprobs, finish = parse_item(item)
                r = rows[i]
                if r["tokens"]:  # a row sent again: its prefix was prefilled under the new weights
                    self.refreshes["rows"] += 1
                    self.refreshes["recomputed_tokens"] += len(prompts[i]) + len(r["tokens"])
                r["tokens"] += tokens
                r["logprobs"] += logprobs
                r["versions"] += [version[i]] * len(tokens)
                got += len(tokens)
                if finish != "abort" or len(r["tokens"]) >= budgets[i]:
                    r["finish"] = "stop" if finish == "stop" else "length"
            empty_aborts = empty_aborts + 1 if not got else 0
            if empty_aborts >= 3:
                raise SGLangError("the server aborted a request three times before it produced a token",
                                  retriable=True)
        out: list[Generation] = []
        for i, prompt in enumerate(prompts):
            r = rows.get(i)
            if r is None:
                out.append(out_of_context(prompt, self._row_version(names[i])))
                continue
            versions = tuple(r["versions"])
            out.append(Generation(tuple(int(x) for x in prompt), tuple(r["tokens"]), tuple(r["logprobs"]),
                                  finish_of(r["finish"], budgets[i], params),  # type: ignore[arg-type]
                                  versions[0] if versions else self._row_version(names[i]),
                                  versions if len(set(versions)) > 1 else ()))
        return out

    def _row_adapters(self, adapters: Sequence[str] | None, n: int) -> list[str | None]:
        """The adapter of each of ``n`` rows (None: this engine serves full weights)."""
        names = row_adapters(adapters, n, list(self._loras))
        if names is None:
            return [None] * n
        unknown = sorted(set(names) - set(self._loras))
        if unknown:
            raise KeyError(f"generate: no adapter {unknown[0]!r} on this engine (it serves {', '.join(self._loras)})")
        return names

    def _row_version(self, name: str | None) -> int:
        return self._version if name is None else self._adapter_versions[name]

    def _adapter_field(self, names: Sequence[str | None]) -> dict:
        """``lora_path`` of a request's rows: each row's adapter at its current version (None for
        an adapter not loaded yet: its version 0 is the base, its B matrices zero); no field
        when no row names one."""
        paths = [self._served.get(n) if n is not None else None for n in names]
        return {"lora_path": paths} if any(p is not None for p in paths) else {}

    # --- several adapters of one base (a shared pool) --------------------------------

    def adapter(self, name: str) -> AdapterEngine:
        """Adapter ``name`` of this server as a rollout engine of its own: its loads, its
        version, its rows (the base and the server are this engine's)."""
        if not name or name not in self._loras:
            raise KeyError(f"no adapter {name!r} on this engine "
                           f"(it serves {', '.join(n for n in self._loras if n) or 'no named adapters'})")
        return AdapterEngine(self, name)

    def adapter_version(self, name: str) -> int:
        """The version adapter ``name`` holds (KeyError: no such adapter)."""
        return self._adapter_versions[name]

    def load_adapter(self, name: str, named_tensors: NamedTensors, version: int) -> None:
        """Version ``version`` of adapter ``name``, loaded beside the others."""
        if name not in self._loras:
            raise KeyError(f"load_adapter: no adapter {name!r} on this engine")
        with self._loading:
            self._load_adapter(named_tensors, version, name)

    def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Pause generation, load the weights as ``version``, continue (a LoRA version: load it
        as a new adapter, no pause)."""
        with self._loading:
            self._load_weights(named_tensors, version)

    def _load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        if self.lora is not None:
            self._load_adapter(named_tensors, version)
            return
        if self._loras:
            raise KeyError(f"load_weights: this engine serves the adapters {', '.join(self._loras)} of "
                           f"{self.model_path}; load a version of one with load_adapter(name, ...)")
        self.pause()
        try:
            if self.cfg.weight_transport == "disk":
                path = self.write_weights(named_tensors, version)
                answer = self._post("/update_weights_from_disk", {
                    "model_path": str(path), "weight_version": str(version), "flush_cache": True,
                })
            else:
                answer = self._post("/update_weights_from_tensor", {
                    "serialized_named_tensors": serialize_for_tensor_update(named_tensors, self.cfg.tp_size),
                    "weight_version": str(version), "flush_cache": True,
                })
            if not answer.get("success", False):
                raise SGLangError(f"weight update to version {version} failed: {answer.get('message')}")
        finally:
            self.resume()
        self._version = version
        self._prune_weight_dirs(keep=version)

    def _load_adapter(self, named_tensors: NamedTensors, version: int, adapter: str = "") -> None:
        """A LoRA version: peft's adapter directory (the published names are peft's saved ones),
        loaded as adapter ``v<version>`` (``<adapter>-v<version>`` on a shared pool); rows use it
        from now on and the previous one is unloaded (requests still running on it finish first:
        the server holds an adapter while in use)."""
        from .hf_export import export_adapter  # (peft: LoRA policies only)

        named = {n: t for n, t in iter_named_tensors(named_tensors)}
        plain = [n for n in named if not is_adapter_name(n)]
        if plain:
            raise KeyError(f"load_weights: this engine serves LoRA adapters of {self.model_path}, and {plain[0]!r} "
                           f"is not an adapter tensor")
        name = f"{adapter}-v{version}" if adapter else f"v{version}"
        path = export_adapter(self._weights_root / f"adapter-{name}", self._loras[adapter], named, self.model_path)
        answer = self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        if not answer.get("success", False):
            what = f"adapter {adapter!r} " if adapter else "adapter "
            raise SGLangError(f"loading {what}version {version} failed: {answer.get('message') or answer}")
        before = self._served.get(adapter)
        self._served[adapter], self._adapter_versions[adapter] = name, version
        if not adapter:
            self._version = version
        if before is not None and before != name:
            self._post("/unload_lora_adapter", {"lora_name": before})
            shutil.rmtree(self._weights_root / f"adapter-{before}", ignore_errors=True)

    def close(self) -> None:
        self._calls.shutdown(wait=False, cancel_futures=True)
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            # The server spawns scheduler/detokenizer children: stop the whole group.
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        if self._own_weights_root:
            shutil.rmtree(self._weights_root, ignore_errors=True)
        if self._log_path is not None:  # errors quoted its tail already; a stopped server's log is ours to drop
            shutil.rmtree(self._log_path.parent, ignore_errors=True)
            self._log_path = None

    # --- SGLang-specific ---------------------------------------------------------

    def pause(self) -> None:
        # "retract" puts running requests back in the queue; they resume with new weights — but
        # nothing would tell which tokens came before: outside partial rollouts no request is
        # in flight during a load. With partial rollouts, "abort" returns each row's tokens so
        # far, all of the old version, and _generate_partial sends the rest again.
        self._post("/pause_generation", {"mode": "abort" if self._refresh is not None else "retract"})

    def resume(self) -> None:
        self._post("/continue_generation", {})

    def server_version(self) -> str:
        """The weight version the server itself reports."""
        for path in ("/model_info", "/get_model_info"):
            try:
                info = self._get(path)
            except SGLangError as err:
                if "HTTP 404" in str(err):
                    continue
                raise
            return str(info["weight_version"])
        raise SGLangError("server exposes neither /model_info nor /get_model_info")

    def write_weights(self, named_tensors: NamedTensors, version: int) -> Path:
        """A loadable model directory for ``version``: base config/tokenizer files plus
        ``model.safetensors`` with the given tensors (written atomically)."""
        from safetensors.torch import save_file

        target = self._weights_root / f"v{version}"
        tmp = self._weights_root / f".v{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in _MODEL_SIDE_FILES:
            if (self.model_path / name).exists():
                shutil.copy2(self.model_path / name, tmp / name)
        tensors = {n: t.detach().to("cpu").contiguous() for n, t in iter_named_tensors(named_tensors)}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "af_version": str(version)})
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
        return target

    # --- internals ---------------------------------------------------------------

    def _launch(self, port: int) -> None:
        log_dir = Path(tempfile.mkdtemp(prefix="af-sglang-log-"))
        self._log_path = log_dir / "server.log"
        cmd = [
            sys.executable, "-m", self.cfg.server_module,
            "--model-path", str(self.model_path),
            "--host", self.cfg.host, "--port", str(port),
            "--tp-size", str(self.cfg.tp_size),
            "--mem-fraction-static", str(self.cfg.mem_fraction_static),
            *self.cfg.extra_args,
        ]
        if self._loras:  # two versions of each adapter at once: the new one's beside the old one's, as it switches
            loras = self._loras.values()
            cmd += ["--enable-lora", "--max-lora-rank", str(max(x.rank for x in loras)),
                    "--max-loras-per-batch", str(2 * len(self._loras)),
                    "--lora-target-modules", *sorted({m for x in loras for m in x.target_modules})]
        if self._version:
            # Resuming at a later version: the server should report it from the start.
            cmd += ["--weight-version", str(self._version)]
        with open(self._log_path, "wb") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise SGLangError(f"SGLang server exited with code {self._proc.returncode} during startup; "
                                  f"log tail:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
                last = str(err)
            time.sleep(0.5)
        raise SGLangError(f"SGLang server at {self.base_url} not healthy after {timeout_s:.0f} s ({last}); "
                          f"log tail:\n{self._log_tail()}", retriable=True)

    def _log_tail(self, n: int = 4000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no log: external server)"
        return self._log_path.read_bytes()[-n:].decode(errors="replace")

    def _post(self, path: str, body: dict):
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, headers={"Content-Type": "application/json"})
        return self._send(req, path)

    def _get(self, path: str):
        return self._send(urllib.request.Request(self.base_url + path), path)

    def _send(self, req: urllib.request.Request, path: str):
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.request_timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read()[:2000].decode(errors="replace")
            raise SGLangError(f"{path}: HTTP {err.code}: {detail}", retriable=err.code >= 500) from err
        except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
            raise SGLangError(f"{path}: cannot reach {self.base_url}: {err}", retriable=True) from err
        return json.loads(raw) if raw else {}

    def _prune_weight_dirs(self, keep: int) -> None:
        # The server has loaded the weights; older copies only take disk space.
        for d in self._weights_root.glob("v*"):
            if d.name != f"v{keep}":
                shutil.rmtree(d, ignore_errors=True)


def _max_positions(model_path: Path) -> int | None:
    try:
        config = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    n = config.get("max_position_embeddings")
    return int(n) if isinstance(n, int) and n > 0 else None


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
