"""GPT-2's byte-level BPE, encoded by tiktoken's Rust core built offline from the shipped files.

``encoder.json`` maps token strings to ids and ``vocab.bpe`` lists the merges in priority order.
Token strings spell bytes with GPT-2's printable stand-ins (``Ġ`` for a space, ...). tiktoken wants
``bytes → rank`` with ranks in merge order; for GPT-2's files ranks and ids coincide, and for a
vocabulary trained elsewhere one array maps ranks to ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

import numpy as np

from gptkit.tokenizer.base import Tokenizer
from gptkit.tokenizer.bpe import read_encoder, read_merges

END_OF_TEXT = "<|endoftext|>"
# GPT-2's pre-tokenizer: contractions, words, numbers, punctuation runs, whitespace.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@cache
def byte_to_char() -> dict[int, str]:
    """GPT-2's reversible byte ↔ printable-character table.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, ...) take the
    characters from U+0100 on, in byte order. Its order is also GPT-2's rank order of single bytes.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class ByteLevelTokenizer(Tokenizer):
    style = "bytelevel"

    @classmethod
    def from_files(
        cls, encoder_path: str | Path, merges_path: str | Path, special_tokens: Sequence[str] | None = None
    ) -> ByteLevelTokenizer:
        """GPT-2's files; its one special token, <|endoftext|>, is implied (``special_tokens`` unused)."""
        return cls(encoder_path, merges_path)

    def __init__(self, encoder_path: str | Path, merges_path: str | Path):
        import tiktoken

        encoder = read_encoder(encoder_path)
        self.encoder = encoder
        self.merges = read_merges(merges_path)
        char_to_byte = {c: b for b, c in byte_to_char().items()}

        def to_bytes(token: str, where: str) -> bytes:
            try:
                return bytes(char_to_byte[c] for c in token)
            except KeyError as e:
                raise ValueError(f"{where}: {token!r} has a character outside GPT-2's byte alphabet") from e

        # Ranks in merge order: the 256 single bytes first (GPT-2's order), then one per merge.
        ranks = {bytes([b]): rank for rank, b in enumerate(byte_to_char())}
        for line, (left, right) in enumerate(self.merges, start=2):
            ranks.setdefault(to_bytes(left + right, f"{merges_path}, line {line}"), len(ranks))

        self.special_tokens = {END_OF_TEXT: encoder.get(END_OF_TEXT, len(encoder))}
        self._n_special = 0 if END_OF_TEXT in encoder else 1
        size = len(encoder) + self._n_special
        rank_to_id = np.full(len(ranks) + 1, -1, dtype=np.int64)
        self._id_to_rank = np.full(size, -1, dtype=np.int64)
        bytes_to_rank = ranks
        for token, token_id in encoder.items():
            if token == END_OF_TEXT:
                continue
            rank = bytes_to_rank.get(to_bytes(token, str(encoder_path)))
            if rank is None:
                # Usually vocab.bpe lost its last lines, or the two files come from different vocabularies.
                raise ValueError(
                    f"{encoder_path}: token {token!r} is neither a single byte nor made by one of the "
                    f"{len(self.merges):,} merges in {merges_path}: that file is truncated, or the two "
                    "files do not belong together"
                )
            rank_to_id[rank] = token_id
            self._id_to_rank[token_id] = rank
        special_rank = len(ranks)
        rank_to_id[special_rank] = self.special_tokens[END_OF_TEXT]
        self._id_to_rank[self.special_tokens[END_OF_TEXT]] = special_rank
        missing = np.flatnonzero(rank_to_id < 0)
        if missing.size:
            raise ValueError(
                f"{encoder_path}: {missing.size} byte sequences made by the merges in {merges_path} have "
                "no id: one of the two files is damaged, or they do not belong together"
            )

        self._identity = bool(np.array_equal(rank_to_id, np.arange(len(rank_to_id))))
        self._rank_to_id = rank_to_id
        self._encoding = tiktoken.Encoding(
            name=f"gptkit-bytelevel-{size}",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={END_OF_TEXT: special_rank},
        )

    def __len__(self) -> int:
        return len(self.encoder) + self._n_special

    @property
    def n_special(self) -> int:
        return self._n_special

    def hf_tokenizer(self):
        """GPT-2's pipeline in ``tokenizers``: its byte-level pre-tokenizer uses GPT-2's pattern."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, processors

        vocab = {**self.encoder, **self.special_tokens}
        hf_tokenizer = HFTokenizer(models.BPE(vocab=vocab, merges=self.merges, fuse_unk=False))
        hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf_tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        hf_tokenizer.decoder = decoders.ByteLevel()
        return self._with_special_tokens(hf_tokenizer)

    def hf_config(self) -> dict:
        return {
            "tokenizer_class": "GPT2Tokenizer",
            "bos_token": END_OF_TEXT,
            "eos_token": END_OF_TEXT,
            "unk_token": END_OF_TEXT,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,  # decode gives the text back as it was
        }

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        """Token ids of ``text``. ``<|endoftext|>`` written in the text is plain text unless allowed."""
        if allow_special:
            ranks = self._encoding.encode(text, allowed_special="all")
        else:
            ranks = self._encoding.encode_ordinary(text)
        return ranks if self._identity else self._rank_to_id[ranks].tolist()

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        batch = self._encoding.encode_ordinary_batch(list(texts))
        return batch if self._identity else [self._rank_to_id[ranks].tolist() for ranks in batch]

    def decode(self, ids: Sequence[int]) -> str:
        array = np.asarray(ids, dtype=np.int64).reshape(-1)
        if array.size and (array.min() < 0 or array.max() >= len(self)):
            position = int(np.flatnonzero((array < 0) | (array >= len(self)))[0])
            raise ValueError(
                f"token id {int(array[position])} at position {position} is out of range 0..{len(self) - 1}"
            )
        ranks = array if self._identity else self._id_to_rank[array]
        return self._encoding.decode(ranks.tolist(), errors="replace")
