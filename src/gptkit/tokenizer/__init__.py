"""Tokenizers: GPT-1's BPE (ftfy + spaCy + ``</w>``), GPT-2's byte-level BPE, and training your own."""

from gptkit.tokenizer.base import Tokenizer, tokenizer_digest
from gptkit.tokenizer.bytelevel import END_OF_TEXT, ByteLevelTokenizer
from gptkit.tokenizer.detokenizer import detokenize
from gptkit.tokenizer.gpt1 import GPT1_SPECIAL_TOKENS, GPT1Tokenizer, text_standardize
from gptkit.tokenizer.train import train_bpe

__all__ = [
    "END_OF_TEXT",
    "GPT1_SPECIAL_TOKENS",
    "ByteLevelTokenizer",
    "GPT1Tokenizer",
    "Tokenizer",
    "detokenize",
    "text_standardize",
    "tokenizer_digest",
    "train_bpe",
]
