"""GPT-1's tokenizer, giving the same ids as OpenAI's original ``text_utils.py``.

The published pipeline, per text: ``ftfy.fix_text``; ``text_standardize`` (dashes, ellipses,
punctuation runs, whitespace); spaCy's English tokenizer; each token lower-cased; BPE over its
characters with ``</w>`` glued to the last one; symbols missing from the encoder map to id 0.

Speed without changing a single id: after ``text_standardize`` the text is chunks separated by
single spaces, and spaCy tokenizes each space-separated chunk on its own (its rules never look
across a space). So the ids of each distinct chunk are computed once, through spaCy and BPE, and
cached; a corpus then costs ftfy, one regex pass and a dictionary lookup per chunk.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from gptkit.checkpoint import read_json, write_json
from gptkit.tokenizer.base import Tokenizer
from gptkit.tokenizer.bpe import BPE, read_merges, write_merges

GPT1_SPECIAL_TOKENS = ["_start_", "_delimiter_", "_classify_"]
END_OF_WORD = "</w>"
# A chunk longer than this (no real word is) is cut into pieces before BPE, whose cost grows with the
# square of a word's length: a 10 MB run of letters must not hang the tokenizer.
MAX_CHUNK_CHARS = 1000
_CACHE_LIMIT = 1_000_000

_PUNCTUATION_RUNS = re.compile(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""")
_NEWLINES = re.compile(r"\s*\n\s*")
_SPACES = re.compile(r"[^\S\n]+")
_REPLACEMENTS = str.maketrans({"—": "-", "–": "-", "―": "-", "´": "'"})


def text_standardize(text: str) -> str:
    """GPT-1's text clean-up: normalise dashes and ellipses, pad punctuation runs, collapse whitespace."""
    text = text.translate(_REPLACEMENTS).replace("…", "...")
    text = _PUNCTUATION_RUNS.sub(r" \1 ", text)
    text = _NEWLINES.sub(" \n ", text)
    text = _SPACES.sub(" ", text)
    return text.strip()


def _require_gpt1_extra():
    try:
        import ftfy
        import spacy
    except ImportError as e:
        raise ImportError(
            f"GPT-1's tokenizer needs ftfy and spaCy ({e.name} is missing): pip install 'gptkit[gpt1]'"
        ) from e
    return ftfy, spacy


class GPT1Tokenizer(Tokenizer):
    style = "gpt1"

    def __init__(
        self,
        encoder_path: str | Path,
        merges_path: str | Path,
        special_tokens: Sequence[str] = GPT1_SPECIAL_TOKENS,
    ):
        ftfy, spacy = _require_gpt1_extra()
        self._fix_text = ftfy.fix_text
        self._spacy = spacy.blank("en").tokenizer
        self.encoder: dict[str, int] = read_json(encoder_path)
        if not isinstance(self.encoder, dict):
            raise ValueError(f"{encoder_path}: expected a JSON object mapping tokens to ids")
        self.merges = read_merges(merges_path)
        self.bpe = BPE(self.merges)
        self.decoder = {i: token for token, i in self.encoder.items()}
        base = len(self.encoder)
        self.special_tokens = {token: base + i for i, token in enumerate(special_tokens)}
        self.decoder.update({i: token for token, i in self.special_tokens.items()})
        self._chunk_cache: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.encoder) + len(self.special_tokens)

    @property
    def n_special(self) -> int:
        return len(self.special_tokens)

    def word_ids(self, token: str) -> list[int]:
        """Ids of one spaCy token, as the original ``bpe()`` then ``encoder.get(t, 0)`` gives them."""
        token = token.lower()
        symbols = self.bpe(tuple(token[:-1]) + (token[-1] + END_OF_WORD,))
        joined = " ".join(symbols)
        if joined == "\n  </w>":  # the original's special case for a newline token
            joined = "\n</w>"
        return [self.encoder.get(symbol, 0) for symbol in joined.split(" ")]

    def _chunk_ids(self, chunk: str) -> list[int]:
        ids = self._chunk_cache.get(chunk)
        if ids is None and chunk == "\n":
            # spaCy keeps the space after a newline in the token ("\n "), which the original maps to "\n</w>".
            ids = self.word_ids("\n ")
        if ids is None:
            ids = []
            for start in range(0, len(chunk), MAX_CHUNK_CHARS):
                for token in self._spacy(chunk[start : start + MAX_CHUNK_CHARS]):
                    ids.extend(self.word_ids(token.text))
            if len(self._chunk_cache) >= _CACHE_LIMIT:
                self._chunk_cache.clear()
            self._chunk_cache[chunk] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for chunk in text_standardize(self._fix_text(text)).split(" "):
            if chunk:
                ids.extend(self._chunk_ids(chunk))
        return ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        self._check_ids(ids)
        text = "".join(self.decoder[int(i)] for i in ids)
        return text.replace(END_OF_WORD, " ").strip()

    def save_pretrained(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_json(directory / "encoder.json", self.encoder)
        write_merges(directory / "vocab.bpe", self.merges)
        self._write_config(directory, {"encoder": "encoder.json", "merges": "vocab.bpe"})
