"""GPT-1's tokenizer, giving the same ids as OpenAI's original ``text_utils.py``.

The published pipeline, per text: ``ftfy.fix_text``; ``text_standardize`` (dashes, ellipses,
punctuation runs, whitespace); spaCy's English tokenizer; each token lower-cased; BPE over its
characters with ``</w>`` glued to the last one; symbols missing from the encoder map to id 0.

Speed without changing a single id:
- after ``text_standardize`` the text is chunks separated by single spaces, and spaCy tokenizes
  each space-separated chunk on its own (its rules never look across a space). So the ids of each
  distinct chunk are computed once and cached, and the new chunks of a text go through spaCy in one
  call rather than one call each;
- BPE results are cached per word, as in the original;
- ftfy leaves a line of printable ASCII without ``&`` unchanged, so such lines skip it; the others
  go through ftfy's own per-line fixer with the same settings ``ftfy.fix_text`` would use.
The tests check the ids against a plain transcription of the original on real text.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from gptkit.tokenizer.base import Tokenizer
from gptkit.tokenizer.bpe import BPE, read_encoder, read_merges
from gptkit.tokenizer.detokenizer import detokenize

GPT1_SPECIAL_TOKENS = ["_start_", "_delimiter_", "_classify_"]
END_OF_WORD = "</w>"
# A chunk longer than this (no real word is) is cut into pieces before BPE, whose cost grows with the
# square of a word's length: a 10 MB run of letters must not hang the tokenizer.
MAX_CHUNK_CHARS = 1000
_CACHE_LIMIT = 1_000_000
_SPACY_BATCH = 20_000  # new chunks per spaCy call
# Printable ASCII but "&" (which may start an HTML entity), tab and newline: ftfy changes none of it.
_FTFY_NOOP = re.compile(r"[\t\n\x20-\x25\x27-\x7e]*")

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


def fix_text(text: str) -> str:
    """``ftfy.fix_text(text)``, skipping the lines it would leave unchanged.

    Mirrors ftfy's own loop: segments end at newlines (or every ``max_decode_length`` characters),
    and HTML unescaping turns off for good at the first segment containing "<".
    """
    if _FTFY_NOOP.fullmatch(text):
        return text
    import ftfy

    config = ftfy.TextFixerConfig(explain=False)
    out, pos = [], 0
    while pos < len(text):
        end = text.find("\n", pos) + 1 or len(text)
        end = min(end, pos + config.max_decode_length)
        segment = text[pos:end]
        if config.unescape_html == "auto" and "<" in segment:
            config = config._replace(unescape_html=False)
        out.append(segment if _FTFY_NOOP.fullmatch(segment) else ftfy.fix_and_explain(segment, config)[0])
        pos = end
    return "".join(out)


def _require_gpt1_extra():
    try:
        import ftfy
        import spacy
    except ImportError as e:
        raise ImportError(
            f"GPT-1's tokenizer needs ftfy and spaCy ({e.name} is missing): pip install -e '.[gpt1]'"
        ) from e
    return ftfy, spacy


@functools.cache
def _spacy_tokenizer(thread: int):
    """spaCy's English rules (``spacy.blank("en")`` takes 0.05-0.15 s), made once per thread: a
    tokenizer keeps a cache as it runs, so threads do not share one."""
    _, spacy = _require_gpt1_extra()
    return spacy.blank("en").tokenizer


class GPT1Tokenizer(Tokenizer):
    style = "gpt1"

    @classmethod
    def from_files(
        cls, encoder_path: str | Path, merges_path: str | Path, special_tokens: Sequence[str] | None = None
    ) -> GPT1Tokenizer:
        return cls(
            encoder_path, merges_path, GPT1_SPECIAL_TOKENS if special_tokens is None else special_tokens
        )

    def __init__(
        self,
        encoder_path: str | Path,
        merges_path: str | Path,
        special_tokens: Sequence[str] = GPT1_SPECIAL_TOKENS,
    ):
        self._spacy = _spacy_tokenizer(threading.get_ident())
        self.encoder: dict[str, int] = read_encoder(encoder_path)
        self.merges = read_merges(merges_path)
        self.bpe = BPE(self.merges)
        self.decoder = {i: token for token, i in self.encoder.items()}
        base = len(self.encoder)
        self.special_tokens = {token: base + i for i, token in enumerate(special_tokens)}
        self.decoder.update({i: token for token, i in self.special_tokens.items()})
        self._chunk_cache: dict[str, list[int]] = {}
        self._word_cache: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.encoder) + len(self.special_tokens)

    @property
    def n_special(self) -> int:
        return len(self.special_tokens)

    def word_ids(self, token: str) -> list[int]:
        """Ids of one spaCy token, as the original ``bpe()`` then ``encoder.get(t, 0)`` gives them."""
        ids = self._word_cache.get(token)
        if ids is None:
            ids = self._word_cache[token] = self._bpe_ids(token.lower())
        return ids

    def _bpe_ids(self, token: str) -> list[int]:
        symbols = self.bpe(tuple(token[:-1]) + (token[-1] + END_OF_WORD,))
        joined = " ".join(symbols)
        if joined == "\n  </w>":  # the original's special case for a newline token
            joined = "\n</w>"
        return [self.encoder.get(symbol, 0) for symbol in joined.split(" ")]

    def _cache_new_chunks(self, chunks: Iterable[str]) -> None:
        """Tokenize the chunks not seen yet, all in one spaCy call, and cache their ids."""
        distinct = [c for c in dict.fromkeys(chunks) if c]
        new = [c for c in distinct if c not in self._chunk_cache]
        if len(self._chunk_cache) + len(new) > _CACHE_LIMIT:  # bound memory on endless corpora
            self._chunk_cache.clear()
            self._word_cache.clear()
            new = distinct
        short = []
        for chunk in new:
            if chunk == "\n":
                # spaCy keeps the space after a newline in the token ("\n "), which the original
                # maps to "\n</w>".
                self._chunk_cache[chunk] = self.word_ids("\n ")
            elif len(chunk) > MAX_CHUNK_CHARS:
                ids = []
                for start in range(0, len(chunk), MAX_CHUNK_CHARS):
                    for token in self._spacy(chunk[start : start + MAX_CHUNK_CHARS]):
                        ids.extend(self.word_ids(token.text))
                self._chunk_cache[chunk] = ids
            else:
                short.append(chunk)
        for start in range(0, len(short), _SPACY_BATCH):
            self._tokenize_together(short[start : start + _SPACY_BATCH])

    def _tokenize_together(self, chunks: list[str]) -> None:
        """One spaCy Doc for many chunks: "a b c" tokenizes as a, b and c each alone; tokens are
        matched back to their chunk by character offset."""
        ends, offset = [], 0
        for chunk in chunks:
            offset += len(chunk)
            ends.append(offset)
            offset += 1
        pieces: list[list[int]] = [[] for _ in chunks]
        index = 0
        for token in self._spacy(" ".join(chunks)):
            while token.idx >= ends[index]:
                index += 1
            pieces[index].extend(self.word_ids(token.text))
        self._chunk_cache.update(zip(chunks, pieces))

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        chunked = [text_standardize(fix_text(text)).split(" ") for text in texts]
        self._cache_new_chunks(c for chunks in chunked for c in chunks)
        cache = self._chunk_cache
        out = []
        for chunks in chunked:
            ids: list[int] = []
            for chunk in chunks:
                if chunk:
                    ids.extend(cache[chunk])
            out.append(ids)
        return out

    def hf_tokenizer(self):
        """The whole pipeline in ``tokenizers`` (see gpt1_normalizer): the same ids on real text,
        apart from the cases that module names."""
        from tokenizers import Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        from gptkit.tokenizer.gpt1_normalizer import gpt1_normalizer

        # A symbol missing from the encoder is id 0, as in the original (GPT-1's id 0 is "<unk>").
        unknown = next((token for token, token_id in self.encoder.items() if token_id == 0), None)
        vocab = {**self.encoder, **self.special_tokens}
        bpe = models.BPE(
            vocab=vocab, merges=self.merges, end_of_word_suffix=END_OF_WORD, unk_token=unknown, fuse_unk=False
        )
        hf_tokenizer = HFTokenizer(bpe)
        hf_tokenizer.normalizer = gpt1_normalizer(self._spacy.rules)
        hf_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(" ", "removed"),
                # spaCy splits icons (°, ©, ✓, ...) off wherever they are.
                pre_tokenizers.Split(Regex(r"\p{So}"), "isolated"),
            ]
        )
        hf_tokenizer.decoder = decoders.BPEDecoder(suffix=END_OF_WORD)
        return self._with_special_tokens(hf_tokenizer)

    def hf_config(self) -> dict:
        # Not OpenAIGPTTokenizer: it would replace this pipeline by BERT's (see gpt1_normalizer).
        # No unk_token either: transformers would then match "<unk>" in text as one token.
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "additional_special_tokens": list(self.special_tokens),
            "clean_up_tokenization_spaces": False,
        }

    def decode(self, ids: Sequence[int]) -> str:
        self._check_ids(ids)
        text = "".join(self.decoder[int(i)] for i in ids)
        return text.replace(END_OF_WORD, " ").strip()

    def decode_text(self, ids: Sequence[int]) -> str:
        """The ids as written text: ``decode``'s space-separated tokens put back together
        (``did n't`` → ``didn't``, no space before punctuation), see ``detokenize``."""
        return detokenize(self.decode(ids))
