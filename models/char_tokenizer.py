"""Character-level tokenizer for the locally bootstrapped tiny model.

Owns the vocabulary (special tokens + printable ASCII) and writing it in Hugging Face
tokenizer format, so ``transformers.AutoTokenizer.from_pretrained(path)`` loads it as a
fast tokenizer and SGLang can serve the same directory. Nothing here is downloaded.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders
from tokenizers.models import BPE

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIALS = (PAD, EOS, BOS, UNK)
# Printable ASCII covers the arithmetic task and leaves room for later text workflows.
ALPHABET = tuple(chr(c) for c in range(32, 127))


def vocab() -> dict[str, int]:
    """Token -> id. Specials first so ``<pad>`` is 0 and ``<eos>`` is 1."""
    return {tok: i for i, tok in enumerate(SPECIALS + ALPHABET)}


def build_tokenizer() -> Tokenizer:
    """A BPE model with no merges is exactly a character tokenizer; ``Fuse`` joins
    characters back without the spaces a plain decoder would insert."""
    tok = Tokenizer(BPE(vocab=vocab(), merges=[], unk_token=UNK))
    tok.add_special_tokens(list(SPECIALS))
    tok.decoder = decoders.Fuse()
    return tok


def save_tokenizer(out_dir: Path, model_max_length: int = 256) -> None:
    """Write tokenizer.json + tokenizer_config.json + special_tokens_map.json."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out_dir))
