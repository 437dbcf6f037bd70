"""Train a BPE vocabulary on your own corpus, written in the same file formats as GPT-1's or GPT-2's.

The merge learning is Hugging Face ``tokenizers``' (fast, well kept); gptkit owns the glue: the
pre-tokenization that matches each style, and writing ``encoder.json`` + ``vocab.bpe`` +
``tokenizer_config.json`` (+ transformers' ``tokenizer.json``) so that ``Tokenizer.from_pretrained``
and ``AutoTokenizer.from_pretrained`` read the result at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from gptkit.io import write_json
from gptkit.progress import hidden_unless_terminal
from gptkit.tokenizer.base import Tokenizer
from gptkit.tokenizer.bpe import write_merges
from gptkit.tokenizer.bytelevel import END_OF_TEXT, ByteLevelTokenizer, byte_to_char
from gptkit.tokenizer.gpt1 import (
    END_OF_WORD,
    GPT1_SPECIAL_TOKENS,
    MAX_CHUNK_CHARS,
    GPT1Tokenizer,
    _require_gpt1_extra,
    text_standardize,
)

Style = Literal["gpt1", "bytelevel"]
NEWLINE_SYMBOL = "\n" + END_OF_WORD


def _lines(files: Sequence[str | Path], desc: str) -> Iterator[str]:
    """Stream the corpus a line at a time, with a progress bar over bytes read."""
    total = sum(Path(f).stat().st_size for f in files)
    with tqdm(
        total=total, unit="B", unit_scale=True, desc=desc, leave=False, disable=hidden_unless_terminal()
    ) as bar:
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    bar.update(len(line.encode("utf-8", errors="replace")))
                    yield line


def _gpt1_words(files: Sequence[str | Path]) -> Iterator[list[str]]:
    """GPT-1's pre-tokenization of each line: ftfy, text_standardize, spaCy, lower-case."""
    ftfy, spacy = _require_gpt1_extra()
    tokenizer = spacy.blank("en").tokenizer
    cache: dict[str, list[str]] = {}
    for line in _lines(files, "pre-tokenizing"):
        words = []
        for chunk in text_standardize(ftfy.fix_text(line)).split(" "):
            if not chunk or chunk == "\n":
                continue
            if chunk not in cache:
                cache[chunk] = [t.text.lower() for t in tokenizer(chunk[:MAX_CHUNK_CHARS])]
            words.extend(cache[chunk])
        yield words


def _learn_bytelevel(files: Sequence[str | Path], vocab_size: int, min_frequency: int, show_progress: bool):
    """GPT-2's byte-level BPE learnt by the tokenizers library: every byte in the alphabet first."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    alphabet = list(byte_to_char().values())
    if vocab_size < len(alphabet) + 1:
        raise ValueError(f"vocab_size {vocab_size} is below the 257 tokens every byte-level vocabulary holds")
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=alphabet,
        show_progress=show_progress,
    )
    hf.train_from_iterator(_lines(files, "reading corpus"), trainer=trainer)
    return hf


def _learn_gpt1(files: Sequence[str | Path], vocab_size: int, min_frequency: int, show_progress: bool):
    """GPT-1's BPE (words from its normalizer, ``</w>`` word ends) learnt by the tokenizers library.
    The newline symbol is added after training (spaCy's newline tokens cannot pass a whitespace
    pre-tokenizer), then the three special tokens: the merges leave room for both."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    n_base = vocab_size - len(GPT1_SPECIAL_TOKENS) - 1
    if n_base < 2:
        raise ValueError(
            f"vocab_size {vocab_size} leaves no room for a vocabulary besides the special tokens"
        )
    hf = HFTokenizer(models.BPE(end_of_word_suffix=END_OF_WORD))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=n_base,
        min_frequency=min_frequency,
        end_of_word_suffix=END_OF_WORD,
        show_progress=show_progress,
    )
    hf.train_from_iterator((" ".join(words) for words in _gpt1_words(files)), trainer=trainer)
    return hf


def train_bpe(
    files: Sequence[str | Path],
    vocab_size: int,
    out_dir: str | Path,
    style: Style = "bytelevel",
    min_frequency: int = 2,
    show_progress: bool = True,
) -> Tokenizer:
    """Learn merges from ``files`` until the vocabulary has ``vocab_size`` tokens; save to ``out_dir``."""
    missing = [str(f) for f in files if not Path(f).is_file()]
    if missing:
        raise FileNotFoundError(f"corpus file(s) not found: {', '.join(missing)}")
    if style not in ("bytelevel", "gpt1"):
        raise ValueError(f"style must be 'gpt1' or 'bytelevel', got {style!r}")
    learn = _learn_bytelevel if style == "bytelevel" else _learn_gpt1
    hf = learn(files, vocab_size, min_frequency, show_progress)

    model = json.loads(hf.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if style == "gpt1":
        # Newlines are tokens of GPT-1's pipeline (the original vocabulary has "\n</w>" too).
        model["vocab"].setdefault(NEWLINE_SYMBOL, len(model["vocab"]))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "encoder.json", model["vocab"])
    write_merges(out_dir / "vocab.bpe", merges)
    kind = ByteLevelTokenizer if style == "bytelevel" else GPT1Tokenizer
    specials = GPT1_SPECIAL_TOKENS if style == "gpt1" else [END_OF_TEXT]
    tokenizer = kind.from_files(out_dir / "encoder.json", out_dir / "vocab.bpe", specials)
    tokenizer.save_pretrained(out_dir)  # tokenizer_config.json, and transformers' files
    return tokenizer


@dataclass
class TokenizerTrainConfig:
    """Train a BPE vocabulary on your corpus, in GPT-1's or GPT-2's file format."""

    corpus: list[str] = field(metadata={"help": "Text files to learn the merges from."})
    vocab_size: int = field(metadata={"help": "Tokens in the vocabulary, special tokens included."})
    out: str = field(metadata={"help": "Directory to write the tokenizer to."})
    style: Literal["bytelevel", "gpt1"] = field(
        default="bytelevel",
        metadata={"help": "bytelevel (GPT-2's byte-level BPE) or gpt1 (ftfy + spaCy + </w> word ends)."},
    )
    min_frequency: int = field(default=2, metadata={"help": "Merge only pairs seen at least this often."})


def train_tokenizer(config: TokenizerTrainConfig) -> Tokenizer:
    """:func:`train_bpe` with ``gptkit tokenizer train``'s settings."""
    return train_bpe(
        config.corpus, config.vocab_size, config.out, style=config.style, min_frequency=config.min_frequency
    )
