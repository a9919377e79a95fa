"""Contract stub of the SGLang HTTP server (CONTRACT TEST DOUBLE, not an engine).

Implements exactly the request/response shapes ``engines/sglang.py`` relies on, and
validates requests the way SGLang's request dataclasses do (unknown keys rejected):

* ``GET /health``; ``GET /model_info`` and ``GET /get_model_info`` (``weight_version``)
* ``POST /generate``: ``input_ids`` (list of id lists), ``sampling_params`` (dict or one
  dict per prompt), ``return_logprob``; answers one object per prompt with
  ``output_ids`` and ``meta_info.output_token_logprobs`` as ``[logprob, id, None]``
* ``POST /update_weights_from_disk``: ``model_path`` must hold ``config.json`` and
  safetensors whose names/shapes exist in the served model
* ``POST /update_weights_from_tensor``: ``serialized_named_tensors`` (one str per rank)
* ``POST /pause_generation`` (``mode``: abort | retract | in_place), ``/continue_generation``
* ``POST /load_lora_adapter`` (``lora_name``, ``lora_path``: a peft adapter directory) and
  ``/unload_lora_adapter``; ``/generate``'s ``lora_path`` names loaded adapters, per row;
  launched with ``--enable-lora``, an adapter above ``--max-lora-rank`` or on modules outside
  ``--lora-target-modules`` is refused, and so is a batch naming more adapters than
  ``--max-loras-per-batch``, as the server's LoRA memory pool refuses them

Tokens are a deterministic function of (prompt, step, weight version) so a weight update
is observable. ``GET /stub/calls`` (stub only) returns the request log for assertions.
With ``token_delay_s`` (``--token-delay-s``) each decoding step of a ``/generate`` takes that
long, outside the server's lock, and a ``/pause_generation`` with ``mode: abort`` meanwhile
ends it at once: every row answers the tokens it has with ``finish_reason.type == "abort"``,
as SGLang's scheduler does for the requests it aborts.
Run as ``python -m sglang_stub --model-path DIR --port N`` (same flags as
``sglang.launch_server``; unknown flags are ignored).
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SAMPLING_KEYS = {"temperature", "top_p", "top_k", "min_p", "max_new_tokens", "stop_token_ids", "stop",
                 "no_stop_trim", "ignore_eos", "sampling_seed", "skip_special_tokens", "n"}
GENERATE_KEYS = {"input_ids", "text", "sampling_params", "return_logprob", "logprob_start_len",
                 "top_logprobs_num", "return_text_in_logprobs", "stream", "rid", "lora_path"}
LOAD_LORA_KEYS = {"lora_name", "lora_path", "pinned"}
DISK_KEYS = {"model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
             "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step", "flush_cache"}
TENSOR_KEYS = {"serialized_named_tensors", "load_format", "flush_cache", "abort_all_requests", "weight_version"}


class BadRequest(Exception):
    pass


def _check_keys(body: dict, allowed: set[str], what: str) -> None:
    unknown = set(body) - allowed
    if unknown:
        raise BadRequest(f"{what}: unexpected keyword argument(s) {sorted(unknown)}")


class StubState:
    def __init__(self, model_path: str, weight_version: str, vocab_size: int = 104,
                 token_delay_s: float = 0.0, lora_limits: dict | None = None) -> None:
        from safetensors import safe_open

        self.model_path = model_path
        self.weight_version = weight_version
        self.vocab_size = vocab_size
        self.token_delay_s = token_delay_s
        self.aborts = 0  #: pauses in abort mode so far: a generation started before one ends
        self.loras: dict[str, str] = {}  #: loaded adapters: name -> directory
        #: launched with --enable-lora: {"max_rank", "targets", "per_batch"}, enforced as the server
        #: does (None: started in-process by a test, no limits)
        self.lora_limits = lora_limits
        self.paused = False
        self.calls: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        self.shapes: dict[str, list[int]] = {}
        for f in Path(model_path).glob("*.safetensors"):
            with safe_open(str(f), "pt") as fh:
                for k in fh.keys():
                    self.shapes[k] = list(fh.get_slice(k).get_shape())

    def generate(self, body: dict) -> list[dict]:
        _check_keys(body, GENERATE_KEYS, "GenerateReqInput")
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in ids):
            raise BadRequest("input_ids must be a non-empty list of non-empty int lists")
        sp = body.get("sampling_params", {})
        per = sp if isinstance(sp, list) else [sp] * len(ids)
        if len(per) != len(ids):
            raise BadRequest("sampling_params list must match input_ids")
        for s in per:
            _check_keys(s, SAMPLING_KEYS, "SamplingParams")
            if s.get("top_k", -1) == 0:
                raise BadRequest("top_k must be -1 (disable) or >= 1")
        if self.paused:
            raise BadRequest("generation is paused")
        adapters = body.get("lora_path")
        adapters = adapters if isinstance(adapters, list) else [adapters] * len(ids)
        for name in adapters:
            if name is not None and name not in self.loras:
                raise BadRequest(f"LoRA adapter {name!r} is not loaded")
        if self.lora_limits and len({a for a in adapters if a is not None}) > self.lora_limits["per_batch"]:
            raise BadRequest(f"more adapters in one batch than --max-loras-per-batch {self.lora_limits['per_batch']}")
        version = int(self.weight_version) if self.weight_version.isdigit() else 0
        aborts = self.aborts
        rows = [{"prompt": prompt, "stops": set(s.get("stop_token_ids") or []), "limit": s.get("max_new_tokens", 128),
                 "tokens": [], "triples": [], "reason": None, "adapter": sum(map(ord, a or ""))}
                for prompt, s, a in zip(ids, per, adapters)]
        for step in range(max(r["limit"] for r in rows)):  # step-major, as a batch decodes
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
                if self.aborts != aborts:  # paused in abort mode: every unfinished row ends now
                    for r in rows:
                        r["reason"] = r["reason"] or {"type": "abort", "message": "Abort in pause_generation."}
                    break
            for r in rows:
                if r["reason"] is not None:
                    continue
                tok = (sum(r["prompt"]) + 7 * step + 13 * version + r["adapter"]) % self.vocab_size
                r["tokens"].append(tok)
                r["triples"].append([-math.log(2.0 + (tok % 5)), tok, None])
                if tok in r["stops"]:
                    r["reason"] = {"type": "stop", "matched": tok}
                elif len(r["tokens"]) >= r["limit"]:
                    r["reason"] = {"type": "length", "length": r["limit"]}
        out = []
        for r in rows:
            reason = r["reason"] or {"type": "length", "length": r["limit"]}
            meta = {"id": f"stub-{len(self.calls)}", "finish_reason": reason, "prompt_tokens": len(r["prompt"]),
                    "completion_tokens": len(r["tokens"]), "cached_tokens": 0, "weight_version": self.weight_version}
            if body.get("return_logprob"):
                meta["output_token_logprobs"] = r["triples"]
            out.append({"text": "", "output_ids": r["tokens"], "meta_info": meta})
        return out

    def update_from_disk(self, body: dict) -> dict:
        from safetensors import safe_open

        _check_keys(body, DISK_KEYS, "UpdateWeightFromDiskReqInput")
        path = Path(body["model_path"])
        if not (path / "config.json").exists():
            return {"success": False, "message": f"{path} has no config.json", "num_paused_requests": 0}
        files = list(path.glob("*.safetensors"))
        if not files:
            return {"success": False, "message": f"no safetensors under {path}", "num_paused_requests": 0}
        for f in files:
            with safe_open(str(f), "pt") as fh:
                for k in fh.keys():
                    shape = list(fh.get_slice(k).get_shape())
                    if self.shapes and self.shapes.get(k) != shape:
                        return {"success": False, "message": f"{k}: shape {shape} vs model {self.shapes.get(k)}",
                                "num_paused_requests": 0}
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    def update_from_tensor(self, body: dict) -> dict:
        _check_keys(body, TENSOR_KEYS, "UpdateWeightsFromTensorReqInput")
        ser = body.get("serialized_named_tensors")
        if not isinstance(ser, list) or not all(isinstance(x, str) for x in ser):
            raise BadRequest("serialized_named_tensors must be a list of str (one per TP rank)")
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return {"success": True, "message": "Succeeded to update model weights."}

    def load_lora(self, body: dict) -> dict:
        _check_keys(body, LOAD_LORA_KEYS, "LoadLoRAAdapterReqInput")
        path = Path(body["lora_path"])
        if not (path / "adapter_config.json").exists() or not (path / "adapter_model.safetensors").exists():
            return {"success": False, "error_message": f"{path} is not a peft adapter directory"}
        config = json.loads((path / "adapter_config.json").read_text())
        if config.get("peft_type") != "LORA" or not config.get("r"):
            return {"success": False, "error_message": f"{path}: not a LoRA adapter config"}
        if body["lora_name"] in self.loras:
            return {"success": False, "error_message": f"adapter {body['lora_name']!r} is already loaded"}
        limits = self.lora_limits
        if limits is not None:
            if config["r"] > limits["max_rank"]:
                return {"success": False, "error_message": f"LoRA rank {config['r']} exceeds --max-lora-rank "
                                                           f"{limits['max_rank']}"}
            outside = sorted(set(config.get("target_modules") or ()) - set(limits["targets"]))
            if outside:
                return {"success": False, "error_message": f"target modules {outside} are not in "
                                                           f"--lora-target-modules {limits['targets']}"}
        self.loras[body["lora_name"]] = str(path)
        return {"success": True, "loaded_adapters": dict(self.loras)}

    def unload_lora(self, body: dict) -> dict:
        _check_keys(body, {"lora_name"}, "UnloadLoRAAdapterReqInput")
        if self.loras.pop(body["lora_name"], None) is None:
            return {"success": False, "error_message": f"adapter {body['lora_name']!r} is not loaded"}
        return {"success": True, "loaded_adapters": dict(self.loras)}

    def model_info(self) -> dict:
        return {"model_path": self.model_path, "tokenizer_path": self.model_path, "is_generation": True,
                "weight_version": self.weight_version}


def make_server(state: StubState, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output quiet
            pass

        def _reply(self, code: int, payload) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            with state.lock:
                if self.path == "/stub/calls":
                    return self._reply(200, state.calls)
                state.calls.append((self.path, {}))
                if self.path == "/health":
                    return self._reply(200, {})
                if self.path in ("/model_info", "/get_model_info"):
                    return self._reply(200, state.model_info())
            return self._reply(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                return self._reply(400, {"error": "invalid JSON"})
            if self.path == "/generate" and state.token_delay_s:  # a slow generation runs outside the lock
                with state.lock:
                    state.calls.append((self.path, body))
                try:
                    return self._reply(200, state.generate(body))
                except (BadRequest, KeyError, TypeError) as err:
                    return self._reply(400, {"error": {"message": str(err)}})
            with state.lock:
                state.calls.append((self.path, body))
                try:
                    if self.path == "/generate":
                        return self._reply(200, state.generate(body))
                    if self.path == "/update_weights_from_disk":
                        res = state.update_from_disk(body)
                        return self._reply(200 if res["success"] else 400, res)
                    if self.path in ("/load_lora_adapter", "/unload_lora_adapter"):
                        res = state.load_lora(body) if self.path == "/load_lora_adapter" else state.unload_lora(body)
                        return self._reply(200 if res["success"] else 400, res)
                    if self.path == "/update_weights_from_tensor":
                        return self._reply(200, state.update_from_tensor(body))
                    if self.path == "/pause_generation":
                        _check_keys(body, {"mode"}, "PauseGenerationReqInput")
                        if body.get("mode", "abort") not in ("abort", "retract", "in_place"):
                            raise BadRequest(f"Invalid mode: {body.get('mode')!r}")
                        state.paused = True
                        if body.get("mode", "abort") == "abort":
                            state.aborts += 1
                        return self._reply(200, {"message": "Generation paused successfully.", "status": 200})
                    if self.path == "/continue_generation":
                        _check_keys(body, {"torch_empty_cache"}, "ContinueGenerationReqInput")
                        state.paused = False
                        return self._reply(200, {"message": "Generation continued successfully.", "status": 200})
                except (BadRequest, KeyError, TypeError) as err:
                    return self._reply(400, {"error": {"message": str(err)}})
            return self._reply(404, {"detail": "Not Found"})

    return ThreadingHTTPServer((host, port), Handler)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--token-delay-s", type=float, default=0.0)
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int, default=0)
    p.add_argument("--max-loras-per-batch", type=int, default=8)
    p.add_argument("--lora-target-modules", nargs="*", default=[])
    args, _unknown = p.parse_known_args()
    limits = ({"max_rank": args.max_lora_rank, "targets": args.lora_target_modules, "per_batch": args.max_loras_per_batch}
              if args.enable_lora else None)
    make_server(StubState(args.model_path, args.weight_version, token_delay_s=args.token_delay_s, lora_limits=limits),
                args.host, args.port).serve_forever()


if __name__ == "__main__":
    main()
