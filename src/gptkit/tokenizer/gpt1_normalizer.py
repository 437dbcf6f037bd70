"""GPT-1's text pipeline as ``tokenizers`` normalizers, for the ``tokenizer.json`` that transformers reads.

transformers' own OpenAIGPTTokenizer splits text with BERT's rules, not spaCy's: "it's" becomes
it ' s (spaCy: it 's), "don't" don ' t (do n't), "2.7" 2 . 7, and newlines vanish; that gives other
ids than GPT-1 was trained on for 43% of SST-2's sentences. So gptkit writes the pipeline itself.

``tokenizers`` runs normalizers (whole text) and then pre-tokenizers, and lower-cases only as a
normalizer, while spaCy decides some splits by case ("Mr." stays whole, "end." splits). So every
step here rewrites the cased text, and a split is a space put into it; lower-casing comes last and
the pre-tokenizer only cuts at the spaces. The steps, in order:

1. ``ftfy.fix_text``'s fixes that real text meets: NFC, straight quotes, line breaks, control
   characters, C1 characters as Windows-1252, Latin ligatures;
2. ``text_standardize``: dashes, ellipses, a space around runs of punctuation, whitespace collapsed;
3. spaCy's English tokenizer on each space-separated chunk: its exceptions (contractions,
   abbreviations), read from spaCy's own table; prefixes, suffixes and infixes as rules below.

Each rule replaces one character by itself plus a space (``tokenizers`` mishandles empty matches).
Not reproduced, so ids differ there (see docs/ecosystem.md): what ftfy repairs beyond the above
(mojibake like "â€™", HTML entities like "&amp;", full-width letters), spaCy's URL
matching ("www.Example.com" stays whole in spaCy), exceptions spaCy merges back after an affix
split ("Wed." → We d.), and chunks over 1,000 characters, which gptkit cuts before spaCy.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from tokenizers import Regex
from tokenizers import normalizers as N

LATIN_LIGATURES = {"ﬀ": "ff", "ﬁ": "fi", "ﬂ": "fl", "ﬃ": "ffi", "ﬄ": "ffl", "ﬅ": "ſt", "ﬆ": "st"}
# The characters text_standardize puts spaces around (each run of one of them becomes a chunk).
STANDARDIZED = '-~!";?+,)(\\/*[]}{|_'
# Of those, the ones spaCy splits off one by one ("!!" → ! !); "--", "~~", "//", "||", "\\" stay.
SPLIT_RUNS = '!";?+,)(*[]}{_'
# spaCy's prefixes and suffixes that are left in a chunk after text_standardize. Icons (°, ©, ...)
# are split off everywhere by the pre-tokenizer instead.
PREFIXES = "§%=`'«»„‚$£€¥₹#&<>:¿¡·"
SUFFIXES = "'`«»„‚<>:#&·¿¡"
CURRENCIES = "$£€¥₹"
# After a number, spaCy splits these off as a suffix ("5km" → 5 km).
UNITS = (
    "km km² km³ m m² m³ dm dm² dm³ cm cm² cm³ mm mm² mm³ ha µm nm yd in ft kg g mg µg t lb oz m/s "
    "km/h kmh mph hPa Pa mbar mb MB kb KB gb GB tb TB T G M K %"
).split()
# A period ends a token after these (and after two capitals): "end." → end . but "Mr.", "U.S." stay.
PERIOD_SPLITS_AFTER = r"0-9\p{Ll}%²\-+'\"`«»„‚…,:;!?¿¡()\[\]{}<>_#*&"
# Where a chunk ends: whitespace, or an icon (°, ©, ✓; the pre-tokenizer splits those off).
GAP, NOT_GAP = r"[\s\p{So}]", r"[^\s\p{So}]"
CHUNK_END = f"(?!{NOT_GAP})"
# What may follow an exception that starts with a prefix ('em.) and still let spaCy find it.
AFFIX_TAIL = f"[.%{re.escape(SUFFIXES)}]*"
MAX_PREFIX_RUN = 16
# Placeholders for a "." or "'" that belongs to an exception ("Mr.", "goin'"): no rule splits them.
KEPT_PERIOD, KEPT_QUOTE = "\ue000", "\ue001"


def _esc(text: str) -> str:
    return re.escape(text)


def _space_before(char: str, before: str = "", after: str = "") -> N.Replace:
    """A space before ``char`` wherever the lookarounds ``before``/``after`` hold."""
    return N.Replace(Regex(f"{before}{_esc(char)}{after}"), " " + char)


def _space_after(char: str, before: str = "", after: str = "") -> N.Replace:
    return N.Replace(Regex(f"{before}{_esc(char)}{after}"), char + " ")


def _after_any(keys: Iterable[str]) -> str:
    """Lookbehind: the chunk so far is one of ``keys`` (each alternative has a fixed length)."""
    return "(?:" + "|".join(f"(?<={GAP}{_esc(k)})" for k in sorted(keys)) + ")"


def ftfy_steps() -> list:
    """The fixes of ``ftfy.fix_text`` that real text needs (the rest: see the module's docstring)."""
    steps = []
    for code in range(0x80, 0xA0):  # C1 controls are Windows-1252 read as Latin-1: \x85 is "…"
        with contextlib.suppress(UnicodeDecodeError):  # five bytes that cp1252 leaves undefined
            steps.append(N.Replace(chr(code), bytes([code]).decode("cp1252")))
    steps += [N.Replace(ligature, letters) for ligature, letters in LATIN_LIGATURES.items()]
    return steps + [
        N.NFC(),
        N.Replace(Regex("[\u02bc\u2018-\u201b]"), "'"),
        N.Replace(Regex("[\u201c-\u201f]"), '"'),
        N.Replace(Regex("\r\n|[\r\u2028\u2029]"), "\n"),
        N.Replace(Regex("[\x00-\x08\x0b\x0e-\x1f\x7f\u206a-\u206f\ufff9-\ufffc\ufeff]"), ""),
    ]


def standardize_steps() -> list:
    """``text_standardize``, step for step."""
    steps = [N.Replace(Regex("[—–―]"), "-"), N.Replace("´", "'"), N.Replace("…", "...")]
    for char in STANDARDIZED:
        steps.append(_space_before(char, before=f"(?<!{_esc(char)})"))
        steps.append(_space_after(char, after=f"(?!{_esc(char)})"))
    steps += [N.Replace(Regex(r"\s*\n\s*"), " \n "), N.Replace(Regex(r"[^\S\n]+"), " "), N.Strip()]
    return steps


def _exceptions(rules: Mapping[str, Sequence[Mapping]]) -> tuple[dict[str, list[str]], set[str]]:
    """spaCy's special cases that can be a chunk here: those it splits (key → pieces), those it keeps."""
    from spacy.symbols import ORTH

    split, kept = {}, set()
    for key, tokens in rules.items():
        if any(c.isspace() or c in STANDARDIZED or c == "’" for c in key):
            continue  # never a chunk after ftfy and text_standardize
        pieces = [token[ORTH] for token in tokens]  # spaCy checks that they spell the key
        if len(pieces) > 1:
            split[key] = pieces
        else:
            kept.add(key)
    return split, kept


def spacy_steps(rules: Mapping[str, Sequence[Mapping]]) -> list:
    """spaCy's English tokenizer on each chunk; ``rules`` is its exception table (``tokenizer.rules``)."""
    split, kept = _exceptions(rules)
    # A "." or "'" that ends a kept exception ("Mr.", "goin'") is hidden from the suffix rules.
    keep_period = {k[:-1] for k in kept if k.endswith(".") and len(k) > 1}
    keep_quote = {k[:-1] for k in kept if k.endswith("'") and len(k) > 1}
    protect = [
        N.Replace(Regex(_after_any(keep_period) + r"\." + CHUNK_END), KEPT_PERIOD),
        N.Replace(Regex(_after_any(keep_quote) + "'" + CHUNK_END), KEPT_QUOTE),
    ]
    steps = _run_steps() + _prefix_steps(split, kept) * 2 + (protect + _suffix_steps(protect)) * 3
    steps += _infix_steps(keep_period) + _exception_splits(split)
    return steps + [N.Replace(KEPT_PERIOD, "."), N.Replace(KEPT_QUOTE, "'")]


def _run_steps() -> list:
    """Ellipses anywhere, and runs of one punctuation character, are split off first."""
    steps = [
        _space_before(".", before=r"(?<=[^\s\p{So}.])", after=r"(?=\.)"),
        _space_after(".", before=r"(?<=\.)", after=r"(?=[^\s\p{So}.])"),
    ]
    steps += [N.Replace(Regex(f"(?<={_esc(c)}){_esc(c)}"), " " + c) for c in SPLIT_RUNS]
    for char in PREFIXES.replace("'", ""):  # a run of one prefix at the start: one token each
        run = "|".join(GAP + _esc(char) * n for n in range(MAX_PREFIX_RUN))
        steps.append(_space_after(char, before=f"(?<={run})", after=f"(?={_esc(char)})"))
    for char in SUFFIXES.replace("'", ""):  # ... and of one suffix at the end
        steps.append(_space_before(char, before=f"(?<={_esc(char)})", after=f"(?={_esc(char)}*{CHUNK_END})"))
    return steps


def _prefix_steps(split: Mapping[str, list[str]], kept: set[str]) -> list:
    """A prefix character at the start of a chunk, unless the chunk (less its suffixes) is an
    exception that starts with it ('em, :D). After a "'" spaCy looks the rest up first: 's. → ' s."""
    exceptions = kept | set(split)
    steps = []
    for char in PREFIXES:
        starting = sorted(_esc(k[1:]) for k in exceptions if k.startswith(char) and len(k) > 1)
        guard = f"(?!(?:{'|'.join(starting)}){AFFIX_TAIL}{CHUNK_END})" if starting else ""
        if char == "'":
            guard += "(?!')"  # '' is one quote
        steps.append(_space_after(char, f"(?<={GAP})", f"{guard}(?={NOT_GAP})"))
    rest_kept = sorted(_esc(k) for k in kept if "'" + k not in exceptions)
    return steps + [
        _space_after("'", f"(?<={GAP})", f"(?=(?:{'|'.join(rest_kept)}){CHUNK_END})"),
        _space_after("'", f"(?<={GAP}')", f"(?={NOT_GAP})"),
        _space_after("$", f"(?<={GAP}US|{GAP}C|{GAP}A)", f"(?={NOT_GAP})"),  # US$, C$, A$
    ]


def _suffix_steps(protect: list) -> list:
    """Suffix characters, 's, a final period (after a lower-case letter, a digit, punctuation or two
    capitals: "end." and "USA." split, "U.S." and "I." do not), currencies and units after a number."""
    steps = [_space_before(c, f"(?<={NOT_GAP})", CHUNK_END) for c in SUFFIXES if c != "'"]
    steps += [
        _space_before("'", r"(?<=[^\s\p{So}'])", CHUNK_END),
        _space_before("'", r"(?<=[^\s\p{So}'])", "(?='" + CHUNK_END + ")"),  # '' is one quote
        _space_before("'", f"(?<={NOT_GAP})", "(?=[sS]" + CHUNK_END + ")"),  # 's
        *protect,  # again: the steps above may have uncovered an exception ("Corp.'s")
        _space_before(".", f"(?<=[{PERIOD_SPLITS_AFTER}])", CHUNK_END),
        _space_before(".", r"(?<=\p{Lu}\p{Lu})", CHUNK_END),
    ]
    steps += [_space_before(c, "(?<=[0-9])", CHUNK_END) for c in CURRENCIES]
    units = defaultdict(list)
    for unit in UNITS:
        units[unit[0]].append(_esc(unit[1:]))
    for first, rests in units.items():
        rest = "|".join(sorted(rests, key=len, reverse=True))
        steps.append(_space_before(first, "(?<=[0-9])", f"(?=(?:{rest}){CHUNK_END})"))
    return steps


def _infix_steps(keep_period: set[str]) -> list:
    """A period between a lower-case letter and a capital ("Mr." stays whole: Mr.Smith → Mr. Smith),
    ":<>=" between a letter or digit and a letter, "^" between digits."""
    quotes = "'\"`"
    return [
        N.Replace(Regex(_after_any(keep_period) + rf"\.(?=[\p{{Lu}}{quotes}])"), ". "),
        N.Replace(Regex(rf"(?<=[\p{{Ll}}{quotes}])\.(?=[\p{{Lu}}{quotes}])"), " . "),
        *(N.Replace(Regex(rf"(?<=[\p{{L}}0-9]){_esc(c)}(?=\p{{L}})"), f" {c} ") for c in ":<>="),
        N.Replace(Regex(r"(?<=[0-9])\^(?=[0-9])"), " ^ "),
    ]


def _exception_splits(split: Mapping[str, list[str]]) -> list:
    """Split exceptions (don't → do n't): a space before the character after each split point."""
    by_char = defaultdict(list)
    for key, pieces in split.items():
        position = 0
        for piece in pieces[:-1]:
            position += len(piece)
            left, char, right = key[:position], key[position], key[position + 1 :]
            by_char[char].append(f"(?<={GAP}{_esc(left)}){_esc(char)}(?={_esc(right)}{CHUNK_END})")
    return [N.Replace(Regex("|".join(sorted(alts))), " " + char) for char, alts in sorted(by_char.items())]


def gpt1_normalizer(spacy_rules: Mapping[str, Sequence[Mapping]]) -> N.Sequence:
    """The text as GPT-1's pipeline leaves it before BPE: its tokens, lower-cased, between single spaces."""
    steps = ftfy_steps() + standardize_steps() + [N.Prepend(" ")] + spacy_steps(spacy_rules)
    steps += [N.Replace(Regex(" +"), " "), N.Strip()]
    # Python's lower() writes a word-final sigma as ς; tokenizers' Lowercase always as σ.
    return N.Sequence(steps + [N.Replace(Regex(r"(?<=\p{L})Σ(?!\p{L})"), "ς"), N.Lowercase()])
