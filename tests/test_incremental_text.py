"""IncrementalText against the algorithm it replaced, which decoded the whole continuation and
searched all of it at every token (the spec: every piece and the final text must be the same), and
the work it does per token."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptkit.generation.incremental import REWRITING_HOLD_BACK, IncrementalText
from gptkit.tokenizer import Tokenizer, detokenize
from gptkit.tokenizer.bytelevel import byte_to_char


class ReferenceIncrementalText:
    """IncrementalText as it was before it decoded only the tokens since a cut: every push decodes
    the whole continuation (after the prompt's last token) and searches every stop string in it."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stop=(), raw: bool = False):
        self.decode = tokenizer.decode if raw else tokenizer.decode_text
        rewrites = not raw and type(tokenizer).decode_text is not Tokenizer.decode_text
        self.hold_back = REWRITING_HOLD_BACK if rewrites else 0
        self.context = list(prompt_ids[-1:])
        self.context_text = self.decode(self.context) if self.context else ""
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.recent: list[str] = []
        self.text = ""
        self.stopped = False

    def _decode(self) -> str:
        full = self.decode(self.context + self.ids)
        if full.startswith(self.context_text):
            return full[len(self.context_text) :]
        return self.decode(self.ids)

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(token_id)
        decoded = self._decode()
        self.recent = [*self.recent[-self.hold_back :], decoded] if self.hold_back else [decoded]
        cuts = [c for c in (decoded.find(s) for s in self.stop) if c >= 0]
        if cuts:
            self.stopped = True
            return self._send(decoded[: min(cuts)])
        stable = decoded
        if self.hold_back:
            older = self.recent[0] if len(self.recent) > self.hold_back else ""
            stable = decoded[: len(os.path.commonprefix([decoded, older]))]
        stable = stable.rstrip("\ufffd")
        return self._send(stable[: len(stable) - self._stop_prefix(stable)])

    def flush(self) -> str:
        return "" if self.stopped else self._send(self._decode())

    def _stop_prefix(self, text: str) -> int:
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _send(self, part: str) -> str:
        if not part.startswith(self.text) or len(part) <= len(self.text):
            return ""
        new = part[len(self.text) :]
        self.text = part
        return new


def stream(kind, tokenizer: Tokenizer, prompt: list[int], continuation: list[int], stop, raw: bool):
    """Every piece pushed, then the flush, whether it stopped, and the text sent."""
    text = kind(tokenizer, prompt, stop, raw=raw)
    pieces = [text.push(token) for token in continuation]
    return pieces, text.flush(), text.stopped, text.text


def assert_same_as_reference(tokenizer, prompt, continuation, stop=(), raw=False) -> None:
    expected = stream(ReferenceIncrementalText, tokenizer, prompt, continuation, stop, raw)
    assert stream(IncrementalText, tokenizer, prompt, continuation, stop, raw) == expected


@pytest.fixture(scope="module")
def gpt1(data_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(data_dir / "gpt1_bpe")


@pytest.fixture(scope="module")
def gpt2(data_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(data_dir / "gpt2_bpe")


# Text whose characters GPT-2 splits across tokens (CJK, emoji, accents, combining marks, a flag
# joined by zero-width joiners), around ASCII words and punctuation.
GPT2_PIECES = [
    "hello", " world", " the", ",", ".", " ", "\n", "  ", "中文", "字", "日本語のテキスト", "😀", "👍🏽",
    " 🏳️‍🌈", "é", " café", " naïve", "e\u0301", " Ελληνικά", "ñ", "₿", "\ufffd", "Mr. Darcy", "'s", "\t",
]  # fmt: skip
# GPT-1 token groups around every rule of its detokenizer: quotes (alone, in runs, as apostrophes,
# before "tis"), hyphens and dashes, contractions and spaCy's split pieces ("we d", "can not only"),
# numbers, brackets, signs, ellipses, newlines, a "</w>" spelled across tokens ("<" "/" "w" ">"),
# words cut into pieces; and long words, before which the text may be cut.
GPT1_PHRASES = [
    '"', "'", "_", '" "', "' '", '" \' "', "students '", "in ' tis", "' tis", "well - known",
    "a -- b", "-- \"", "x / y", "did n't", "ca n't", "i 's", "we d", "do nt", "can not", "can not only",
    "gon na", "y' all", "1 , 000", "1 , 000 , 000", "$ 3", "50 %", "( x )", "[ a ]", ". . .", "...",
    "? !", ",", ".", "\n", "\n \n", "<", "< / w >", "< / w ></w>", "hel lo", "00", "<unk>", "_start_",
    "beautiful", "something", "wonderful", "students", "garden", "house", "the", "said", "he", "café",
]  # fmt: skip


def gpt1_ids(gpt1: Tokenizer, phrase: str) -> list[int]:
    """A phrase's tokens: each space-separated word a whole word (``</w>``) unless it is one of the
    pieces "<" "/" "w" ">" "hel" "00", which stay as they are (a word cut into pieces)."""
    pieces = {"<", "/", "w", ">", "hel", "00", "<unk>", "_start_"}
    ids = []
    for word in phrase.split(" "):
        string = word if word in pieces or word.endswith("</w>") else f"{word}</w>"
        ids.append(gpt1.encoder[string] if string in gpt1.encoder else gpt1.special_tokens[string])
    return ids


def stop_strings(draw_data, text: str, literal: list[str]) -> list[str]:
    """Stop strings cut from the continuation's own text (so they straddle tokens), and a few others."""
    stops = list(literal)
    for start, size in draw_data:
        if text:
            at = start % len(text)
            stops.append(text[at : at + size])
    return stops


cut_from_text = st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 6)), max_size=2)
literal_stops = st.lists(st.sampled_from(["the", "\n", ".", "😀", "é", '"', "'s", "zz"]), max_size=2)
PROPERTY = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(
    parts=st.lists(
        st.one_of(st.sampled_from(GPT2_PIECES), st.integers(0x80, 0xFF), st.integers(0, 50_256)), max_size=40
    ),
    split=st.floats(0, 1),
    cut=cut_from_text,
    literal=literal_stops,
    raw=st.booleans(),
)
def test_gpt2_pieces_match_decoding_everything(gpt2, parts, split, cut, literal, raw):
    """Characters split across tokens, a stray continuation byte (a lone byte token 0x80–0xFF),
    any token of the vocabulary, the prompt ending anywhere, even inside a character."""
    by_byte = {b: gpt2.encoder[c] for b, c in byte_to_char().items()}
    ids = []
    for part in parts:
        if isinstance(part, str):
            ids += gpt2.encode(part)
        else:
            ids.append(by_byte[part] if part <= 0xFF else part)
    k = int(split * len(ids))
    prompt, continuation = ids[:k], ids[k:]
    stops = stop_strings(cut, gpt2.decode(continuation), literal)
    assert_same_as_reference(gpt2, prompt, continuation, stops, raw)


@PROPERTY
@given(
    parts=st.lists(st.one_of(st.sampled_from(GPT1_PHRASES), st.integers(0, 40_480)), max_size=40),
    split=st.floats(0, 1),
    cut=cut_from_text,
    literal=literal_stops,
    raw=st.booleans(),
)
def test_gpt1_pieces_match_decoding_everything(gpt1, parts, split, cut, literal, raw):
    ids = [i for part in parts for i in (gpt1_ids(gpt1, part) if isinstance(part, str) else [part])]
    k = int(split * len(ids))
    prompt, continuation = ids[:k], ids[k:]
    decode = gpt1.decode if raw else gpt1.decode_text
    stops = stop_strings(cut, decode(continuation), literal)
    assert_same_as_reference(gpt1, prompt, continuation, stops, raw)


def paragraph_ids(tokenizer: Tokenizer, data_dir, length: int) -> list[int]:
    text = (data_dir / "gutenberg" / "pg11.txt").read_text(encoding="utf-8")
    start = text.index("'Well!' thought Alice to herself")
    ids = tokenizer.encode(text[start : start + 12 * length])
    assert len(ids) >= length
    return ids[:length]


@pytest.mark.parametrize("name", ["gpt2", "gpt1"])
@pytest.mark.parametrize("raw", [False, True])
def test_long_continuation_with_late_stop_strings_matches(request, data_dir, name, raw):
    """600 tokens of a book (quotes, dashes, newlines); stop strings met only near the end, one of
    them straddling tokens, and ones never met."""
    tokenizer = request.getfixturevalue(name)
    ids = paragraph_ids(tokenizer, data_dir, 700)
    prompt, continuation = ids[:100], ids[100:]
    text = (tokenizer.decode if raw else tokenizer.decode_text)(continuation)
    late = text[len(text) - 40 : len(text) - 30]
    assert text.find(late) > len(text) // 2
    assert_same_as_reference(tokenizer, prompt, continuation, raw=raw)
    assert_same_as_reference(tokenizer, prompt, continuation, [late, "zzqx"], raw)
    assert_same_as_reference(tokenizer, prompt, continuation, ["never", late[3:], "\ufffd"], raw)


def test_a_quote_opened_long_before_still_closes(gpt1):
    """GPT-1's detokenizer pairs quote marks by counting all the marks before: a mark many tokens
    after the opening one closes the quotation, though it is far outside the tokens decoded again."""
    words = '" something wonderful happened beside the garden house and nobody noticed . " then'
    ids = [gpt1.encoder[f"{word}</w>"] for word in words.split()]
    assert_same_as_reference(gpt1, [], ids)
    streamed = stream(IncrementalText, gpt1, [], ids, (), False)
    assert streamed[3].endswith('nobody noticed." then')


def test_a_tokenizer_it_does_not_know_decodes_everything():
    """A decode this module knows nothing about is never cut: the text is the reference's."""

    class Letters(Tokenizer):
        def decode(self, ids):
            return " ".join(chr(ord("a") + i % 26) for i in ids).upper()[: 2 * len(ids)]

    ids = [i * 7 % 26 for i in range(60)]
    assert_same_as_reference(Letters(), [3], ids, ["K", "Q X"])
    assert_same_as_reference(Letters(), [3], ids)


def decode_counter(tokenizer: Tokenizer) -> tuple[Tokenizer, list[int]]:
    """A copy of the tokenizer whose decode records how many ids it was given, each call."""
    counted, sizes = copy.copy(tokenizer), []
    decode: Callable[[Sequence[int]], str] = type(tokenizer).decode.__get__(counted)

    def counting(ids: Sequence[int]) -> str:
        sizes.append(len(ids))
        return decode(ids)

    counted.decode = counting
    return counted, sizes


def ids_decoded_per_push(kind, tokenizer, prompt, continuation, raw=False) -> list[int]:
    counted, sizes = decode_counter(tokenizer)
    text, per_push = kind(counted, prompt, ["zzqx"], raw=raw), []
    for token in continuation:
        before = sum(sizes)
        text.push(token)
        per_push.append(sum(sizes) - before)
    return per_push


# The most ids decoded by one push, however long the continuation: the tokens since the last cut.
MAX_IDS_PER_PUSH = 40


@pytest.mark.parametrize(("name", "raw"), [("gpt2", False), ("gpt1", False), ("gpt1", True)])
def test_work_per_push_does_not_grow_with_the_continuation(request, data_dir, name, raw):
    """2,000 tokens of a book: no push decodes more than a few dozen ids (decoding everything, the
    last push decodes all 2,001); the text is still the reference's (checked above on 600)."""
    tokenizer = request.getfixturevalue(name)
    ids = paragraph_ids(tokenizer, data_dir, 2100)
    prompt, continuation = ids[:100], ids[100:]
    per_push = ids_decoded_per_push(IncrementalText, tokenizer, prompt, continuation, raw)
    assert max(per_push) <= MAX_IDS_PER_PUSH
    assert max(per_push[-500:]) <= MAX_IDS_PER_PUSH  # no drift late in the continuation
    if name == "gpt2":  # the reference is quick only here
        everything = ids_decoded_per_push(ReferenceIncrementalText, tokenizer, prompt, continuation)
        assert everything[-1] == len(continuation) + 1


def test_prompt_ending_inside_a_character_still_cuts(gpt2):
    """A prompt (given as ids) that ends with half a character the continuation completes: the text
    is decoded without the prompt's token from then on, and the window still moves."""
    ids = gpt2.encode("𝔘𝔫𝔦𝔠𝔬𝔡𝔢 " + "plain words after it, " * 60)
    half = next(k for k in range(1, len(ids)) if gpt2.decode(ids[:k]).endswith("\ufffd"))
    prompt, continuation = ids[:half], ids[half:]
    assert_same_as_reference(gpt2, prompt, continuation)
    assert_same_as_reference(gpt2, prompt, continuation, ["after it, plain"])
    per_push = ids_decoded_per_push(IncrementalText, gpt2, prompt, continuation)
    assert max(per_push[20:]) <= MAX_IDS_PER_PUSH < len(continuation)


def test_words_cut_before_are_joined_by_no_rule():
    """GPT-1's text is cut only before a word of _INERT_WORD or more ASCII letters and digits: every
    piece its detokenizer joins to the word before, and the "only" it looks ahead to, is shorter."""
    from gptkit.generation.incremental import _INERT_WORD
    from gptkit.tokenizer.detokenizer import _SPLIT_SPELLINGS

    assert all(len(piece) < _INERT_WORD for piece in [*_SPLIT_SPELLINGS, "only"])
    for piece in _SPLIT_SPELLINGS:  # joined by the rule (the guard's premise), unlike a long word
        first = _SPLIT_SPELLINGS[piece].split()[0]
        assert detokenize(f"{first} {piece}") == f"{first}{piece}"
        assert detokenize(f"{first} {piece}wonderful") == f"{first} {piece}wonderful"
