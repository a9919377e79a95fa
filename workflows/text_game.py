"""The text game: find the key of the locked door's colour, take it, open the door.

Owns the game's state machine, its generated task set (deterministic from a seed, with a
held-out split that is a hash of the prompt text, as the arithmetic generator's) and its
observation format: short ASCII lines that fit the tiny model's character vocabulary and
128 positions. It knows nothing about tokenizers, engines or Kafka.

A task says which door is locked and where its key is (``"red door. key: room 3."``; room 0
is the hall, where the player starts). Observations are partial: what a room holds is seen
only on entering it, and another room holds a key of another colour (a decoy). Actions:
``go N`` (enter room N, 0-9), ``take`` (take the key here; one key is held at a time),
``open`` (with the right key: done, reward 1). The shortest solution takes three turns
(``go 3``, ``take``, ``open``), or two when the key lies in the hall. Anything else is
answered by an observation saying what the game understands; a JSON tool call
``{"name": "go", "arguments": {"room": 3}}`` is the same command.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping
from typing import Any

from astraflow.topics import Prompt

from .environments import EnvTask, environment

__all__ = ["TextGame", "text_game_prompts", "solution", "COLOURS"]

#: 40 colours x 10 rooms: 400 games, 33 of them held out (a held-out set large enough to
#: measure a change in the share won; 8 colours left 9 held-out games)
COLOURS = ("red", "blue", "green", "gold", "gray", "pink", "teal", "plum", "tan", "navy", "lime", "mint", "rose",
           "ruby", "jade", "onyx", "sand", "rust", "wine", "aqua", "cyan", "sage", "opal", "ivory", "amber", "coral",
           "peach", "lilac", "olive", "khaki", "beige", "white", "black", "brown", "cream", "mauve", "slate", "azure",
           "ochre", "umber")
ROOMS = 10  #: rooms 0 (the hall) to 9
HELDOUT_BUCKETS = 10


def split_of(text: str) -> str:
    return "heldout" if zlib.crc32(text.encode()) % HELDOUT_BUCKETS == 0 else "train"


def _task(colour: str, room: int) -> tuple[str, dict]:
    """A task's text and its metadata; the decoy is a function of the text, so the text alone
    decides the game wherever it is replayed."""
    text = f"{colour} door. key: room {room}."
    rng = random.Random(zlib.crc32(text.encode()))
    decoy_colour = rng.choice([c for c in COLOURS if c != colour])
    decoy_room = rng.choice([r for r in range(ROOMS) if r != room])
    return text, {"colour": colour, "room": room, "decoy_colour": decoy_colour, "decoy_room": decoy_room}


def solution(room: int) -> str:
    return "take;open" if room == 0 else f"go {room};take;open"


def text_game_prompts(n: int, seed: int = 0, split: str = "train") -> list[Prompt]:
    """``n`` tasks of ``split`` drawn from ``seed`` (with repeats once the split's distinct
    tasks are used up: 367 train and 33 held-out ones exist). ``answer`` is a shortest
    solution, ``metadata`` the game's state."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    pool = [(c, r) for c in COLOURS for r in range(ROOMS) if split_of(_task(c, r)[0]) == split]
    rng = random.Random(f"text-game-{seed}-{split}")
    order = rng.sample(pool, len(pool))
    out = []
    for i in range(n):
        colour, room = order[i % len(order)]
        text, meta = _task(colour, room)
        out.append(Prompt(f"game-{seed}-{split}-{i}", text, solution(room), "text_game", meta))
    return out


@environment("text_game")
class TextGame:
    """One game. ``max_room`` bounds the rooms ``go`` accepts (default 9)."""

    #: the commands as tool schemas (what a chat model's template is given: ``action_format: chat``)
    tools = (
        {"type": "function", "function": {"name": "go", "description": "Enter a room (0 is the hall).",
                                          "parameters": {"type": "object", "properties": {"room": {"type": "integer"}},
                                                         "required": ["room"]}}},
        {"type": "function", "function": {"name": "take", "description": "Take the key in this room.",
                                          "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "open", "description": "Open the locked door with the held key.",
                                          "parameters": {"type": "object", "properties": {}}}},
    )

    def __init__(self, max_room: int = ROOMS - 1) -> None:
        self.max_room = int(max_room)
        self.keys: dict[int, str] = {}
        self.at, self.held, self.colour = 0, "", ""

    def reset(self, task: EnvTask) -> str:
        meta = task.metadata
        try:
            self.colour, room = str(meta["colour"]), int(meta["room"])
            self.keys = {room: self.colour, int(meta["decoy_room"]): str(meta["decoy_colour"])}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"text_game task {task.episode_id}: metadata needs colour, room, decoy_colour and "
                             f"decoy_room (text_game_prompts writes them): {e}") from None
        self.at, self.held = 0, ""
        return task.prompt

    def step(self, action: Any) -> tuple[str, float, bool, Mapping[str, Any]]:
        verb, arg = self._command(action)
        if verb == "go":
            if arg is None or not 0 <= arg <= self.max_room:
                return f"no room {arg if arg is not None else '?'}", 0.0, False, {"valid": False}
            self.at = arg
            here = self.keys.get(arg)
            return f"room {arg}: {here + ' key' if here else 'empty'}", 0.0, False, {"valid": True}
        if verb == "take":
            here = self.keys.pop(self.at, None)
            if here is None:
                return "nothing here", 0.0, False, {"valid": True}
            if self.held:
                self.keys[self.at] = self.held  # one key at a time: the held one is left here
            self.held = here
            return f"you hold the {here} key", 0.0, False, {"valid": True}
        if verb == "open":
            if self.held == self.colour:
                return "the door opens", 1.0, True, {"valid": True}
            return ("wrong key" if self.held else "locked"), 0.0, False, {"valid": True}
        return "try: go N, take, open", 0.0, False, {"valid": False}

    @staticmethod
    def _command(action: Any) -> tuple[str, int | None]:
        if isinstance(action, Mapping):  # a JSON tool call
            verb, args = str(action.get("name", "")), action.get("arguments") or {}
            room = args.get("room") if isinstance(args, Mapping) else None
            return verb, room if isinstance(room, int) and not isinstance(room, bool) else None
        words = str(action).split()
        if not words:
            return "", None
        arg = int(words[1]) if len(words) == 2 and words[1].isdigit() else None
        return words[0], arg

    def close(self) -> None:
        self.keys = {}
