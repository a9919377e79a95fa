"""Weight transfer: zstd-compressed sparse weight deltas and periodic full snapshots on a
dedicated topic, from the trainer's publisher to the RaaS nodes' subscribers.

The room holds, low to high:

* :mod:`.format` — the binary layout of one version (header, tensor table, frames) and the
  BLAKE3 digests that prove two processes hold bit-identical weights;
* :mod:`.codec` — encoding and decoding/applying snapshots and bit-exact sparse deltas, as
  pure functions over tensors (tensors in, bytes out; bytes in, tensors out);
* :mod:`.native` — the codec's optional C kernel (``_deltakernel.c``, loaded with ctypes);
  without it the codec's numpy path writes the same bytes;
* :mod:`.signing` — Ed25519 signatures on announcements (who may move a policy's weights);
* :mod:`.announcements` — the ``versions`` topic read back: a policy's announcements, the newest;
* :mod:`.publisher` — the trainer's side: encode, chunk, make durable, announce, trim;
* :mod:`.prefetch` — chunks read while they are written, before their version is announced;
* :mod:`.held` — a node's verified copy of the weights, and what each engine was given;
* :mod:`.assembly` — reaching a version: the delta or snapshot path, every payload checked;
* :mod:`.subscriber` — a node's side: follow announcements, move the held copy to the newest.

The two ends share nothing but ``weights.<policy>`` (chunked snapshots and sparse deltas)
and the compacted ``versions`` topic (one announcement per version, latest per policy).
The protocol and the retention rule are described in :mod:`.publisher`; how a node
reaches a version (delta path, snapshot path, verification) in :mod:`.assembly`.

It builds on the topics (chunking, messages, clients) and nothing above them: it knows
no job config, no actors (the trainer and rollout actors host a publisher and a
subscriber), no training and no rollouts; an engine is only a :class:`WeightEngine`.
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> the module that defines it. Loaded on first use, so a process that only signs or
#: checks announcements (the launcher making a run's keys, the dataflow) imports no torch.
_EXPORTS = {
    "WeightPublisher": ".publisher", "WeightPublishError": ".publisher", "PublishedVersion": ".publisher",
    "read_latest_announcement": ".announcements", "WeightSubscriber": ".subscriber", "WeightEngine": ".held",
    "AnnouncementSigner": ".signing", "AnnouncementVerifier": ".signing", "Rejection": ".signing",
    "SignatureError": ".signing",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
