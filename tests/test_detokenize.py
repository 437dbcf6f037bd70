"""``detokenize`` and ``decode_text``: GPT-1's tokens joined back the way the text was written.

The reference for real text is the original itself, changed only where GPT-1's pipeline is lossy
by design: ftfy's fixes, ``text_standardize``'s dash and ellipsis replacements, lower case, and
whitespace runs (a newline stays a newline, blank lines collapse).
"""

from __future__ import annotations

import random
import re

import pytest

from gptkit.tokenizer import Tokenizer, detokenize

# (GPT-1's raw decode, the text a person should see)
HAND_CASES = [
    ("i have a king 's ransom ; you did n't know ?", "i have a king's ransom; you didn't know?"),
    ("you ca n't . i 'm , you 're , we 'll , i 've , he 'd .", "you can't. i'm, you're, we'll, i've, he'd."),
    ("wo n't , sha n't , gon na , y' all", "won't, shan't, gonna, y'all"),
    ("we d like a photo i d ; do nt go", "wed like a photo id; dont go"),  # spaCy's no-apostrophe splits
    ("i can not go", "i cannot go"),
    ("you can not only sing but dance", "you can not only sing but dance"),
    ('" hello , " he said , " you fool . "', '"hello," he said, "you fool."'),
    ('he said " no " .', 'he said "no".'),
    ('" yes , " said he . " no ! " \' oh , \' said i.', '"yes," said he. "no!" \'oh,\' said i.'),
    ("' well ! ' thought alice , ' after such a fall ! '", "'well!' thought alice, 'after such a fall!'"),
    ("the students ' books and the james ' car", "the students' books and the james' car"),
    ("nothin ' more , ' tis true", "nothin' more, 'tis true"),
    ("it was _ very _ good , _ i _ think .", "it was _very_ good, _i_ think."),
    ("( quietly ) left [ sic ] { a }", "(quietly) left [sic] {a}"),
    ("50 % of $ 3.5 , or 1 , 000 , 000 people", "50% of $3.5, or 1,000,000 people"),
    ("may 1 , 2005 , and 3 , 7 , 31", "may 1, 2005, and 3, 7, 31"),
    ("a well - known 10 - 20 rule", "a well-known 10-20 rule"),
    ("hey -- you ! ! ! what ? !", "hey--you!!! what?!"),
    ('a -- " b', 'a--"b'),
    ("- a list item", "- a list item"),
    ("and / or 3 / 4 http : // x.com / a", "and/or 3/4 http://x.com/a"),
    ("wait . . . what ... now", "wait . . . what... now"),
    ("line one , \n line two \n \n line three", "line one,\nline two\n\nline three"),
    ('" a quote that \n runs on , " she said', '"a quote that\nruns on," she said'),
    ("\" he said ' hi ' \"", "\"he said 'hi'\""),
    ("x = y + 2 and * * *", "x = y + 2 and * * *"),
    ("already plain text needs no change.", "already plain text needs no change."),
    ("", ""),
]


@pytest.mark.parametrize(("raw", "expected"), HAND_CASES)
def test_detokenize_by_hand(raw, expected):
    assert detokenize(raw) == expected


def test_detokenize_is_idempotent_on_its_output():
    for _, expected in HAND_CASES:
        assert detokenize(expected) == expected


@pytest.fixture(scope="module")
def gpt1(data_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(data_dir / "gpt1_bpe")


def test_decode_stays_raw_and_decode_text_joins(gpt1):
    ids = gpt1.encode("Hello, World! I didn't know.")
    assert gpt1.decode(ids) == "hello , world ! i did n't know ."
    assert gpt1.decode_text(ids) == "hello, world! i didn't know."


def test_base_decode_text_is_decode():
    class Letters(Tokenizer):
        def decode(self, ids):
            return " ".join(chr(ord("a") + i) for i in ids)

    assert Letters().decode_text([0, 1, 2]) == "a b c"


def expected_text(original: str) -> str:
    """The original as GPT-1's pipeline can give it back: ftfy, dashes, ellipses, case, spaces."""
    import ftfy

    text = ftfy.fix_text(original).translate(str.maketrans({"—": "-", "–": "-", "―": "-", "´": "'"}))
    text = re.sub(r"\s*\n\s*", "\n", text.replace("…", "..."))
    return re.sub(r"[^\S\n]+", " ", text).strip().lower()


def gutenberg_paragraphs(path) -> list[str]:
    text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
    return [paragraph.strip() for paragraph in re.split(r"\n\s*\n", text) if paragraph.strip()]


def rte_sentences(data_dir) -> list[str]:
    sentences = []
    for name in ["dev.tsv", "train.tsv"]:
        for row in (data_dir / "rte" / name).read_text(encoding="utf-8").splitlines()[1:]:
            sentences += row.split("\t")[1:3]
    return sentences


# Real paragraphs (book, opening words) covering contractions, both kinds of quotes across line
# breaks, "--" dashes, hyphens, possessives and brackets.
CHOSEN_PARAGRAPHS = [
    ("pg1342", "It is a truth universally acknowledged"),
    ("pg1342", '"Oh! my dear, I am quite delighted with him.'),
    ("pg1342", '"He is just what a young man ought to be," said she'),
    ("pg11", "Alice was beginning to get very tired"),
    ("pg11", "'Well!' thought Alice to herself"),
    ("pg11", "'There's no such thing!' Alice was beginning very angrily"),
    ("pg16", '"Oh no, he isn\'t grown up," Wendy assured her'),
    ("pg1661", '"You don\'t mind breaking the law?"'),
]


def test_chosen_real_paragraphs_round_trip_exactly(gpt1, data_dir):
    books = {
        name: gutenberg_paragraphs(data_dir / "gutenberg" / f"{name}.txt") for name, _ in CHOSEN_PARAGRAPHS
    }
    for name, opening in CHOSEN_PARAGRAPHS:
        paragraph = next(p for p in books[name] if p.startswith(opening))
        assert gpt1.decode_text(gpt1.encode(paragraph)) == expected_text(paragraph)
    rte = rte_sentences(data_dir)
    for opening in ["Dana Reeve, the widow of the actor", "The medical student accused of murdering"]:
        sentence = next(s for s in rte if s.startswith(opening))
        assert gpt1.decode_text(gpt1.encode(sentence)) == expected_text(sentence)


# Measured on this sample: 292 of 300 (0.973); on all 11,415 eligible texts: 0.963. Most misses are
# undecidable: RTE's spaced dashes ("cartel - the world's"), originals with a space before
# punctuation, units written against the number ("100m").
MIN_ROUND_TRIP_RATE = 0.96


def test_most_real_text_round_trips_exactly(gpt1, data_dir):
    """300 texts drawn at random (fixed seed) from RTE sentences and Gutenberg paragraphs of 40–400
    characters. Texts with non-ASCII characters after ftfy are left out: GPT-1's vocabulary maps
    most of them to id 0 (``<unk>``), which no detokenizer can undo."""
    pool = rte_sentences(data_dir)
    for path in sorted((data_dir / "gutenberg").glob("*.txt")):
        pool += [p for p in gutenberg_paragraphs(path) if 40 <= len(p) <= 400]
    pool = [text for text in pool if expected_text(text).isascii()]
    sample = random.Random(0).sample(pool, 300)
    got = [gpt1.decode_text(ids) for ids in gpt1.encode_batch(sample)]
    misses = [
        (expected_text(text), text_back)
        for text, text_back in zip(sample, got)
        if text_back != expected_text(text)
    ]
    rate = 1 - len(misses) / len(sample)
    assert rate >= MIN_ROUND_TRIP_RATE, f"round-trip rate {rate:.3f}; first misses: {misses[:5]}"
