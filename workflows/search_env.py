"""The search environment: answer a question by BM25 lookups in a generated local corpus.

Owns the corpus (short ASCII facts about generated people and towns, the same in every
process: ``"zob lives in tam."``, ``"tam is in the north."``), its BM25 index (the
maintained library ``bm25s``, built once per process), the task set (one-hop and two-hop
questions, deterministic from a seed, with a held-out split that is a hash of the question
text, as the text game's) and the observation format: short lines that fit the tiny model's
character vocabulary and 128 positions. It knows nothing about tokenizers, engines or Kafka.

Questions:

- one hop, ``where does zob live?`` (the town: one search for ``zob``) and ``region of tam?``
  (the region: one search for ``tam``);
- two hops, ``region of zob's town?``: the first search (``zob``) names the town but not the
  region; only a second search, for that town, shows the answer.

Actions: ``search <query>`` (the top ``top_k`` documents with a positive BM25 score, cut to
``max_chars``) and ``answer <text>`` (the episode ends; reward 1 iff the answer equals the
task's after normalisation: case, punctuation, articles and spacing do not count). The JSON
tool calls ``{"name": "search", "arguments": {"query": ...}}`` and ``{"name": "answer",
"arguments": {"text": ...}}`` are the same commands. Anything else is answered by an
observation saying what the environment understands. Each step's ``info`` records the
searches made, the hops the question needs and how many of its facts the searches have shown.
"""

from __future__ import annotations

import random
import re
import threading
import zlib
from collections.abc import Mapping
from typing import Any

from astraflow.topics import Prompt

from .environments import EnvTask, environment

__all__ = ["SearchEnv", "search_prompts", "corpus", "search", "normalize", "split_of", "PEOPLE", "TOWNS",
           "REGIONS"]

CORPUS_SEED = 31  #: the corpus is one fixed world: tasks of every job and seed ask about it
PEOPLE, TOWNS = 192, 48
REGIONS = ("north", "south", "east", "west")
HELDOUT_BUCKETS = 10
TOP_K_MAX, MAX_CHARS_MAX = 8, 512

_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"
#: words of the docs, questions and commands: a generated name is never one of them (nor an
#: English stopword bm25s drops), so a name is found only where it is meant
_RESERVED = {"lives", "live", "where", "does", "region", "town", "search", "answer", "the", "is", "in", "of",
             *REGIONS}


def split_of(text: str) -> str:
    return "heldout" if zlib.crc32(text.encode()) % HELDOUT_BUCKETS == 0 else "train"


class _World:
    """The generated facts and the BM25 index over them (one per process, built on first use)."""

    def __init__(self) -> None:
        import bm25s
        from bm25s.stopwords import STOPWORDS_EN

        rng = random.Random(f"search-corpus-{CORPUS_SEED}")
        names = [c + v + d for c in _CONSONANTS for v in _VOWELS for d in _CONSONANTS]
        names = [n for n in names if n not in _RESERVED and n not in STOPWORDS_EN]
        names = rng.sample(names, PEOPLE + TOWNS)
        self.people, self.towns = names[:PEOPLE], names[PEOPLE:]
        self.region_of = {t: REGIONS[i % len(REGIONS)] for i, t in enumerate(self.towns)}
        self.town_of = {p: self.towns[i % TOWNS] for i, p in enumerate(self.people)}
        self.docs = ([f"{p} lives in {t}." for p, t in self.town_of.items()]
                     + [f"{t} is in the {r}." for t, r in self.region_of.items()])
        self._bm25s = bm25s
        self.index = bm25s.BM25()
        self.index.index(self._tokens(self.docs), show_progress=False)
        self._lock = threading.Lock()

    def _tokens(self, texts: list[str]):
        return self._bm25s.tokenize(texts, stopwords="en", show_progress=False)

    def search(self, query: str, k: int) -> list[str]:
        """The top ``k`` documents for ``query`` by BM25, best first; only those it matches."""
        words = self._bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
        if not words[0]:
            return []
        with self._lock:  # (episodes' environments run on threads of their own)
            ids, scores = self.index.retrieve(words, k=min(k, len(self.docs)), show_progress=False)
        return [self.docs[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]


_WORLD: _World | None = None
_WORLD_LOCK = threading.Lock()


def _world() -> _World:
    global _WORLD
    with _WORLD_LOCK:
        if _WORLD is None:
            _WORLD = _World()
        return _WORLD


def corpus() -> list[str]:
    """Every document of the corpus, in index order."""
    return list(_world().docs)


def search(query: str, k: int = 1) -> list[str]:
    """The top ``k`` documents matching ``query`` by BM25 (fewer when fewer match)."""
    return _world().search(query, k)


def normalize(text: str) -> str:
    """An answer as compared: lower case, no punctuation or articles, single spaces."""
    words = re.sub(r"[^a-z0-9]+", " ", str(text).lower()).split()
    return " ".join(w for w in words if w not in ("the", "a", "an"))


def _questions() -> list[tuple[str, str, dict]]:
    """Every question of the world: ``(text, answer, metadata)``."""
    w = _world()
    out = []
    for p, t in w.town_of.items():
        out.append((f"where does {p} live?", t, {"kind": "town", "hops": 1, "entity": p,
                                                  "facts": [f"{p} lives in {t}."], "solution": f"search {p};answer {t}"}))
    for t, r in w.region_of.items():
        out.append((f"region of {t}?", r, {"kind": "region", "hops": 1, "entity": t,
                                            "facts": [f"{t} is in the {r}."], "solution": f"search {t};answer {r}"}))
    for p, t in w.town_of.items():
        r = w.region_of[t]
        out.append((f"region of {p}'s town?", r, {"kind": "two_hop", "hops": 2, "entity": p, "bridge": t,
                                                   "facts": [f"{p} lives in {t}.", f"{t} is in the {r}."],
                                                   "solution": f"search {p};search {t};answer {r}"}))
    return out


def search_prompts(n: int, seed: int = 0, split: str = "train") -> list[Prompt]:
    """``n`` questions of ``split`` drawn from ``seed`` (with repeats once the split's
    distinct questions are used up). ``answer`` is the answer; ``metadata`` says the kind,
    the hops, the facts that answer it and a shortest ``solution``."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    pool = [q for q in _questions() if split_of(q[0]) == split]
    rng = random.Random(f"search-{seed}-{split}")
    order = rng.sample(pool, len(pool))
    out = []
    for i in range(n):
        text, answer, meta = order[i % len(order)]
        out.append(Prompt(f"search-{seed}-{split}-{i}", text, answer, "search", dict(meta)))
    return out


def _int_param(key: str, value: Any, hi: int) -> int:
    if type(value) is not int or not 1 <= value <= hi:
        raise ValueError(f"env_params.{key} is {value!r}; it is an integer from 1 to {hi}")
    return value


@environment("search")
class SearchEnv:
    """One question. ``top_k``: documents a search shows (1-8); ``max_chars``: the longest
    observation a search gives (the documents that fit, whole; a first one longer is cut)."""

    #: the commands as tool schemas (what a chat model's template is given: ``action_format: chat``)
    tools = (
        {"type": "function", "function": {"name": "search", "description": "Search the corpus.",
                                          "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                         "required": ["query"]}}},
        {"type": "function", "function": {"name": "answer", "description": "Give the final answer.",
                                          "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                                                         "required": ["text"]}}},
    )

    def __init__(self, top_k: int = 1, max_chars: int = 48) -> None:
        self.check_params(top_k, max_chars)
        self.top_k, self.max_chars = top_k, max_chars
        self.answer, self.hops, self.facts = "", 1, ()
        self.searches, self.shown = 0, set()
        _world()  # the index, built here (on the instance's thread, within its create timeout)

    @staticmethod
    def check_params(top_k: int = 1, max_chars: int = 48) -> None:
        """What the job config's ``workflow.params.env_params`` may hold (checked at load)."""
        _int_param("top_k", top_k, TOP_K_MAX)
        _int_param("max_chars", max_chars, MAX_CHARS_MAX)

    def reset(self, task: EnvTask) -> str:
        self.answer = normalize(task.answer)
        if not self.answer:
            raise ValueError(f"search task {task.episode_id}: the answer is empty (search_prompts writes it; a "
                             f"dataset row's 'answer' column)")
        meta = task.metadata
        self.hops = int(meta.get("hops", 1))
        self.facts = tuple(meta.get("facts") or ())
        self.searches, self.shown = 0, set()
        return task.prompt

    def _info(self, valid: bool, **more: Any) -> dict:
        return {"valid": valid, "searches": self.searches, "hops": self.hops,
                "facts_found": sum(f in self.shown for f in self.facts), **more}

    def step(self, action: Any) -> tuple[str, float, bool, Mapping[str, Any]]:
        verb, arg = self._command(action)
        if verb == "search":
            if not arg:
                return "search what?", 0.0, False, self._info(False)
            self.searches += 1
            docs = search(arg, self.top_k)
            self.shown.update(docs)
            return self._fit(docs), 0.0, False, self._info(True)
        if verb == "answer":
            if not normalize(arg):
                return "answer what?", 0.0, False, self._info(False)
            right = normalize(arg) == self.answer
            return ("right" if right else "wrong"), float(right), True, self._info(True, correct=right)
        return "try: search WORDS, answer WORDS", 0.0, False, self._info(False)

    def _fit(self, docs: list[str]) -> str:
        if not docs:
            return "no match"
        out = docs[0][:self.max_chars]
        for d in docs[1:]:
            if len(out) + 1 + len(d) > self.max_chars:
                break
            out += " " + d
        return out

    @staticmethod
    def _command(action: Any) -> tuple[str, str]:
        if isinstance(action, Mapping):  # a JSON tool call
            verb, args = str(action.get("name", "")), action.get("arguments") or {}
            key = {"search": "query", "answer": "text"}.get(verb)
            value = args.get(key) if key and isinstance(args, Mapping) else None
            return verb, value.strip() if isinstance(value, str) else ""
        verb, _, arg = str(action).strip().partition(" ")
        return verb.lower(), arg.strip()

    def close(self) -> None:
        self.shown = set()
