"""The tokenizer interface, and loading either kind from a directory."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gptkit import hub
from gptkit.io import atomic_write, read_json_object, write_json
from gptkit.tokenizer.bpe import write_merges

TOKENIZER_CONFIG = "tokenizer_config.json"
# transformers' (and every `tokenizers` user's) file: the whole pipeline, vocabulary and merges.
TOKENIZER_JSON = "tokenizer.json"
# The Hub's names for a BPE's vocabulary and merges (GPT-1's and GPT-2's repositories alike).
HUB_ENCODER, HUB_MERGES = "vocab.json", "merges.txt"


class Tokenizer:
    """Text to token ids and back. ``Tokenizer.from_pretrained(folder or name)`` returns the right kind."""

    style: str = ""
    special_tokens: dict[str, int]
    encoder: dict[str, int]  # token string → id
    merges: list[tuple[str, str]]  # BPE merges, highest priority first

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def decode_text(self, ids: Sequence[int]) -> str:
        """The ids as text a person reads. ``decode`` gives the tokenizer's raw joining; a tokenizer
        whose raw text is not how people write (GPT-1's space-separated tokens) overrides this."""
        return self.decode(ids)

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        """Ids of the base vocabulary, without the special tokens appended after it."""
        return len(self) - self.n_special

    @property
    def n_special(self) -> int:
        """Special tokens counted after the base vocabulary (model rows a model must add for them)."""
        return 0

    def token_id(self, token: str) -> int:
        if token not in self.special_tokens:
            raise KeyError(
                f"{token!r} is not a special token of this tokenizer: {sorted(self.special_tokens)}"
            )
        return self.special_tokens[token]

    def _check_ids(self, ids: Sequence[int]) -> None:
        size = len(self)
        for position, token_id in enumerate(ids):
            if not 0 <= int(token_id) < size:
                raise ValueError(
                    f"token id {int(token_id)} at position {position} is out of range 0..{size - 1}"
                )

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``encoder.json`` (token → id), ``vocab.bpe`` (merges) and ``tokenizer_config.json``,
        and for transformers ``tokenizer.json`` and its keys in ``tokenizer_config.json``, so that
        ``AutoTokenizer.from_pretrained(directory)`` gives the same ids.

        A directory saved before gptkit wrote the transformers files gets them by loading and saving
        it again: ``Tokenizer.from_pretrained(d).save_pretrained(d)``.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        hf_tokenizer = self.hf_tokenizer()
        write_json(directory / "encoder.json", self.encoder)
        write_merges(directory / "vocab.bpe", self.merges)
        atomic_write(directory / TOKENIZER_JSON, lambda tmp: hf_tokenizer.save(tmp))
        files = {"encoder": "encoder.json", "merges": "vocab.bpe"}
        # One file for both readers: gptkit reads style/files/special_tokens, transformers the rest.
        write_json(
            directory / TOKENIZER_CONFIG,
            {"style": self.style, "files": files, "special_tokens": self.special_tokens, **self.hf_config()},
        )

    def hf_tokenizer(self):
        """This tokenizer as a Hugging Face ``tokenizers.Tokenizer`` (what ``tokenizer.json`` holds),
        giving the same ids as :meth:`encode`."""
        raise NotImplementedError

    def hf_config(self) -> dict:
        """transformers' keys of ``tokenizer_config.json`` (``tokenizer_class``, special tokens, ...)."""
        raise NotImplementedError

    def _with_special_tokens(self, hf_tokenizer):
        """Register the special tokens, at the ids they have here, as transformers' special tokens."""
        from tokenizers import AddedToken

        hf_tokenizer.add_special_tokens(
            [AddedToken(token, special=True, normalized=False) for token in self.special_tokens]
        )
        for token, token_id in self.special_tokens.items():
            if hf_tokenizer.token_to_id(token) != token_id:
                raise ValueError(
                    f"{token!r} has id {token_id} here but {hf_tokenizer.token_to_id(token)} in tokenizer.json"
                )
        return hf_tokenizer

    @classmethod
    def from_files(
        cls, encoder_path: str | Path, merges_path: str | Path, special_tokens: Sequence[str] | None = None
    ) -> Tokenizer:
        """Build this kind of tokenizer from its encoder and merges files."""
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.style:  # each kind registers itself: this module never imports its subclasses
            _STYLES[cls.style] = cls

    @staticmethod
    def from_pretrained(source: str | Path) -> Tokenizer:
        """Load GPT-1's vocabulary, GPT-2's, or a tokenizer saved or trained by gptkit, from a folder or
        a Hub name (``gpt2``, ``openai-community/openai-gpt``: see :mod:`gptkit.hub`).

        A folder is read in this order: gptkit's ``tokenizer_config.json`` (with its ``style``); the
        releases' own files (GPT-1's ``encoder_bpe_40000.json`` + ``vocab_40000.bpe``, GPT-2's
        ``encoder.json`` + ``vocab.bpe``); the Hub's names for them (``vocab.json`` + ``merges.txt``),
        GPT-1's told from GPT-2's by its merges' ``</w>`` word ends.
        """
        with hub.reading(source) as directory:
            return _load_tokenizer(directory)


def _load_tokenizer(directory: Path) -> Tokenizer:
    config_path = directory / TOKENIZER_CONFIG
    # transformers writes a tokenizer_config.json too; gptkit's is the one with a "style".
    config = read_json_object(config_path) if config_path.exists() else {}
    if "style" in config:
        style, files = config.get("style"), config.get("files", {})
        try:
            encoder, merges = directory / files["encoder"], directory / files["merges"]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{config_path}: field files.encoder or files.merges is missing") from e
        for name, path in (("encoder", encoder), ("merges", merges)):
            if not path.is_file():
                raise FileNotFoundError(f"{config_path}: files.{name} names {path}, which is not a file")
        if not isinstance(style, str) or style not in _STYLES:
            raise ValueError(f"{config_path}: style {style!r} is not one of {', '.join(map(repr, _STYLES))}")
        specials = config.get("special_tokens")
        # {token: id} as gptkit writes it (the ids follow the vocabulary), or a list of tokens.
        listed = isinstance(specials, list) and all(isinstance(token, str) for token in specials)
        if not (specials is None or isinstance(specials, dict) or listed):
            raise ValueError(f"{config_path}: field special_tokens is not an object or a list of tokens")
        return _STYLES[style].from_files(encoder, merges, None if specials is None else list(specials))
    for style, encoder, merges in _PUBLISHED_FILES:
        if (directory / encoder).exists() and (directory / merges).exists():
            return _STYLES[style].from_files(directory / encoder, directory / merges)
    encoder, merges = directory / HUB_ENCODER, directory / HUB_MERGES
    if encoder.exists() and merges.exists():
        return _STYLES[merges_style(merges)].from_files(encoder, merges)
    raise FileNotFoundError(
        f"{directory}: no known vocabulary (expected {TOKENIZER_CONFIG} with a style, GPT-1's "
        "encoder_bpe_40000.json + vocab_40000.bpe, GPT-2's encoder.json + vocab.bpe, or the Hub's "
        f"{HUB_ENCODER} + {HUB_MERGES})"
    )


def merges_style(merges_path: Path) -> str:
    """Which kind of BPE a merges file belongs to: GPT-1's marks word ends with ``</w>``, GPT-2's
    byte-level merges never do (the first thousand merges decide)."""
    with open(merges_path, encoding="utf-8", errors="replace") as f:
        head = [line for _, line in zip(range(1000), f)]
    return "gpt1" if any("</w>" in line for line in head) else "bytelevel"


def tokenizer_files(directory: str | Path) -> list[Path]:
    """The files in ``directory`` that :meth:`Tokenizer.from_pretrained` may read, and
    ``tokenizer.json`` (what transformers reads): ``tokenizer_config.json`` and the files it names,
    the releases' vocabulary and merges, and the Hub's names for them. Other files (a model's
    weights beside the tokenizer, say) are not the tokenizer's."""
    directory = Path(directory)
    names = {TOKENIZER_CONFIG, TOKENIZER_JSON, HUB_ENCODER, HUB_MERGES}
    names.update(name for _, encoder, merges in _PUBLISHED_FILES for name in (encoder, merges))
    config_path = directory / TOKENIZER_CONFIG
    if config_path.is_file():
        files = read_json_object(config_path).get("files")
        names.update(str(name) for name in (files.values() if isinstance(files, dict) else ()))
    return sorted(path for path in (directory / name for name in names) if path.is_file())


def tokenizer_digest(directory: str | Path) -> str:
    """sha256 of the tokenizer in ``directory``: its files' names and bytes (:func:`tokenizer_files`),
    in name order. Two folders with the same digest tokenize alike; shards record it in meta.json
    (``tokenizer_sha256``) to refuse a tokenizer other than the one they were made with."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in tokenizer_files(directory):
        name = path.relative_to(directory).as_posix()
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# Tokenizer kinds by style name, filled as gpt1.py and bytelevel.py are imported (by this package).
_STYLES: dict[str, type[Tokenizer]] = {}
_PUBLISHED_FILES = [
    ("gpt1", "encoder_bpe_40000.json", "vocab_40000.bpe"),
    ("bytelevel", "encoder.json", "vocab.bpe"),
]


@dataclass
class TokenizeConfig:
    """Print the token ids of a file (or stdin), or decode ids back to text."""

    tokenizer: str = field(metadata={"help": "Tokenizer folder or Hub name (gpt2, openai-gpt, org/name)."})
    file: str | None = field(
        default=None, metadata={"help": "Text file (default: stdin).", "positional": True}
    )
    decode: bool = field(
        default=False, metadata={"help": "Read whitespace-separated ids and print the text."}
    )
    raw: bool = field(
        default=False, metadata={"help": "With --decode: GPT-1's raw token text, not joined as written."}
    )


def tokenize_file(config: TokenizeConfig) -> str:
    """The token ids of ``config.file`` (default: stdin), space-separated; with ``decode``, the text of
    the whitespace-separated ids it holds (joined as written, or GPT-1's raw token text with ``raw``)."""
    tokenizer = Tokenizer.from_pretrained(config.tokenizer)
    text = Path(config.file).read_text(encoding="utf-8") if config.file else sys.stdin.read()
    if not config.decode:
        return " ".join(map(str, tokenizer.encode(text)))
    ids = [int(x) for x in text.split()]
    return tokenizer.decode(ids) if config.raw else tokenizer.decode_text(ids)
