"""The tokenizer interface, and loading either kind from a directory."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from gptkit.checkpoint import read_json_object, write_json

TOKENIZER_CONFIG = "tokenizer_config.json"


class Tokenizer:
    """Text to token ids and back. ``Tokenizer.from_pretrained(dir)`` returns the right kind."""

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
        """Write ``encoder.json`` (token → id), ``vocab.bpe`` (merges) and ``tokenizer_config.json``."""
        from gptkit.tokenizer.bpe import write_merges

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_json(directory / "encoder.json", self.encoder)
        write_merges(directory / "vocab.bpe", self.merges)
        files = {"encoder": "encoder.json", "merges": "vocab.bpe"}
        write_json(
            directory / TOKENIZER_CONFIG,
            {"style": self.style, "files": files, "special_tokens": self.special_tokens},
        )

    @staticmethod
    def from_pretrained(directory: str | Path) -> Tokenizer:
        """Load GPT-1's vocabulary, GPT-2's, or a tokenizer saved or trained by gptkit."""
        from gptkit.tokenizer.bytelevel import ByteLevelTokenizer
        from gptkit.tokenizer.gpt1 import GPT1Tokenizer

        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory}: no such tokenizer directory")
        config_path = directory / TOKENIZER_CONFIG
        if config_path.exists():
            config = read_json_object(config_path)
            style, files = config.get("style"), config.get("files", {})
            try:
                encoder, merges = directory / files["encoder"], directory / files["merges"]
            except KeyError as e:
                raise ValueError(f"{config_path}: field files.{e.args[0]} is missing") from e
            if style == "gpt1":
                return GPT1Tokenizer(encoder, merges, special_tokens=list(config.get("special_tokens", {})))
            if style == "bytelevel":
                return ByteLevelTokenizer(encoder, merges)
            raise ValueError(f"{config_path}: style {style!r} is not 'gpt1' or 'bytelevel'")
        if (directory / "encoder_bpe_40000.json").exists() and (directory / "vocab_40000.bpe").exists():
            return GPT1Tokenizer(directory / "encoder_bpe_40000.json", directory / "vocab_40000.bpe")
        if (directory / "encoder.json").exists() and (directory / "vocab.bpe").exists():
            return ByteLevelTokenizer(directory / "encoder.json", directory / "vocab.bpe")
        raise FileNotFoundError(
            f"{directory}: no known vocabulary (expected {TOKENIZER_CONFIG}, GPT-1's encoder_bpe_40000.json + "
            "vocab_40000.bpe, or GPT-2's encoder.json + vocab.bpe)"
        )
