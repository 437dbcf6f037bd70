"""A straightforward, one-text-at-a-time GPT-1 encoder: the reference for gptkit's GPT-1 tokenizer.

It follows the algorithm of OpenAI's original ``text_utils.py`` (openai/finetune-transformer-lm)
step by step, written plainly: ftfy, text_standardize, spaCy over the whole text, lower-case, BPE
on the token's characters with ``</w>``, the result joined with spaces and split again, unknown
symbols to 0. It shares no code with gptkit, so the two agreeing is evidence, not tautology.
The tokenizer benchmark uses it as the peer.
"""

from __future__ import annotations

import json
import re

import ftfy
import spacy


def standardize(text: str) -> str:
    text = text.replace("—", "-").replace("–", "-").replace("―", "-")
    text = text.replace("…", "...").replace("´", "'")
    text = re.sub(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""", r" \1 ", text)
    text = re.sub(r"\s*\n\s*", " \n ", text)
    text = re.sub(r"[^\S\n]+", " ", text)
    return text.strip()


class ReferenceGPT1Encoder:
    def __init__(self, encoder_path, bpe_path):
        self.nlp = spacy.blank("en")
        self.nlp.max_length = 10**8
        with open(encoder_path, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(bpe_path, encoding="utf-8") as f:
            lines = f.read().split("\n")[1:-1]
        self.ranks = {tuple(line.split()): i for i, line in enumerate(lines)}
        self.cache = {}

    def bpe(self, token: str) -> str:
        if token in self.cache:
            return self.cache[token]
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            first, second = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if (first, second) not in self.ranks:
                break
            out, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    out.extend(word[i:])
                    break
                out.extend(word[i:j])
                i = j
                if i < len(word) - 1 and word[i + 1] == second:
                    out.append(first + second)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = tuple(out)
        result = " ".join(word)
        if result == "\n  </w>":
            result = "\n</w>"
        self.cache[token] = result
        return result

    def encode(self, texts):
        out = []
        for text in texts:
            doc = self.nlp.tokenizer(standardize(ftfy.fix_text(text)))
            ids = []
            for token in doc:
                ids.extend(self.encoder.get(t, 0) for t in self.bpe(token.text.lower()).split(" "))
            out.append(ids)
        return out
