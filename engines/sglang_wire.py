"""The SGLang server's HTTP request and response shapes the engine speaks (``engines/sglang.py``):
sampling parameters in SGLang's names, a ``/generate`` result read into tokens, log-probs and
finish reason, the same-host tensor transport's payload, and the error every call raises.
Checked against the contract stub (``tests/engines/sglang_stub.py``); only the tensor
transport needs ``sglang`` itself."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Generation, NamedTensors, SamplingParams, iter_named_tensors

__all__ = ["SGLangError", "parse_generation", "parse_item", "sampling_params_json", "serialize_for_tensor_update"]


class SGLangError(RuntimeError):
    """The server failed to start, answered with an error, or reported ``success: false``.

    ``retriable`` is true for connection problems and 5xx answers (a restart may help),
    false for requests the server rejected as malformed.
    """

    def __init__(self, message: str, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


def sampling_params_json(params: SamplingParams) -> dict:
    """SamplingParams in SGLang's names (``top_k = -1`` disables top-k there; stop strings
    are ``stop``, sent only when there are some)."""
    out = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        # Keep the stop token (and a stop string's text) in the output, as the CPU engine does.
        "no_stop_trim": True,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    return out


def parse_item(item: dict) -> tuple[tuple[int, ...], tuple[float, ...], str]:
    """One ``/generate`` result's tokens, their logprobs and its finish type (stop | length |
    abort). Tokens come from ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]``
    triples), which pairs every token with its logprob; ``output_ids`` must agree."""
    meta = item.get("meta_info") or {}
    triples = meta.get("output_token_logprobs")
    if triples is None:
        raise SGLangError("/generate answered without meta_info.output_token_logprobs; was return_logprob sent?")
    tokens = tuple(int(t[1]) for t in triples)
    logprobs = tuple(float(t[0]) for t in triples)
    out_ids = item.get("output_ids")
    if out_ids is not None and tuple(int(t) for t in out_ids) != tokens:
        raise SGLangError(f"output_ids {out_ids} disagree with output_token_logprobs tokens {list(tokens)}")
    return tokens, logprobs, (meta.get("finish_reason") or {}).get("type", "length")


def parse_generation(prompt: Sequence[int], item: dict, version: int) -> Generation:
    """One ``/generate`` result -> ``Generation`` (an aborted one is an error: outside partial
    rollouts nothing here aborts a request)."""
    tokens, logprobs, finish = parse_item(item)
    if finish == "abort":
        raise SGLangError(f"generation aborted by the server: {(item.get('meta_info') or {}).get('finish_reason')}",
                          retriable=True)
    return Generation(
        prompt_ids=tuple(int(x) for x in prompt),
        tokens=tokens,
        logprobs=logprobs,
        finish_reason="stop" if finish == "stop" else "length",
        version=version,
    )


def serialize_for_tensor_update(named_tensors: NamedTensors, tp_size: int) -> list[str]:
    """SGLang's same-host tensor transport: one ``MultiprocessingSerializer`` string per TP
    rank (every rank gets the full tensors and shards them itself)."""
    try:
        from sglang.srt.utils import MultiprocessingSerializer
    except ImportError as err:  # pragma: no cover - needs the gpu extra
        raise SGLangError("weight_transport 'tensor' needs sglang installed in this process; use 'disk'") from err
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pairs = [(n, t.detach().to(device)) for n, t in iter_named_tensors(named_tensors)]
    return [MultiprocessingSerializer.serialize(pairs, output_str=True) for _ in range(tp_size)]
