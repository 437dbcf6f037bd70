"""Join GPT-1's space-separated tokens back into text as a person would write it.

GPT-1's pipeline (``text_standardize`` then spaCy) splits text into tokens, and ``decode`` joins
them with single spaces: ``"I didn't," he said.`` decodes to ``" i did n't , " he said .``.
``detokenize`` undoes the splitting. The splitting loses information (``well-known`` and
``well - known`` give the same tokens), so some rules must guess; each guess below takes the
written form that is far more common in real text, measured on the project's public data
(the five Gutenberg books and RTE). Case is not restored: the tokens are lower-cased for good.

Rules, in the order they apply:

1. Newlines: ``decode`` writes a newline token as `` \n ``; the spaces around it go.
2. Contractions spaCy split off attach to the word before: ``n't 's 're 'll 've 'm 'd``
   (``ca n't`` → ``can't``, ``wo n't`` → ``won't``). spaCy's exceptions also split spellings
   without an apostrophe (``gonna`` → ``gon na``, ``dont`` → ``do nt``, ``wed`` → ``we d``,
   ``id`` → ``i d``, ``y'all`` → ``y' all``); exactly those pairs rejoin.
3. ``can not`` → ``cannot``: spaCy splits ``cannot`` in two. In the project's untokenized data
   ``cannot`` is written about 500 times and ``can not`` 5 times (stylistic, e.g. Shakespeare's
   "we can not atone you"), so joining restores the written form about 99% of the time and reads
   correctly in the rest. ``can not only`` (a different meaning) stays apart.
4. Quotes (``"``, ``'`` and Gutenberg's ``_italics_``) attach to what they enclose: an opening
   mark to the token after it, a closing mark to the token before it. Where the context decides
   (a mark before the end of a line or before ``. , ; : ! ? ) ] }`` closes; one at the start of a
   line or after an opening bracket opens, looking past other lone marks), the context wins;
   elsewhere marks pair by parity within the text. The context rules let the parity recover after
   an unpaired mark, and let a quotation run over a line break (wrapped text). A ``'`` between two
   words, outside a single quotation, after a word ending in ``s`` or ``in`` ends that word (a
   plural possessive ``students' books``, a dropped g ``nothin' more``) and is not a quote;
   before ``tis``, ``twas``, ``twere``, ``twill`` it starts the word (``'tis``).
5. A spaced ellipsis (``. . .``, three or more dots) was written spaced (``...`` stays one token),
   so it is kept as written, with a space before it.
6. No space before closing punctuation ``. , ; : ! ? ) ] } %``, none after ``( [ {``, and none
   between ``$`` or ``#`` and a digit (spaCy splits currency and number signs off).
7. Hyphens: ``text_standardize`` pads every run of ``-`` with spaces, so ``well-known`` and a
   spaced dash ``word - word`` decode alike. A single ``-`` between two words or numbers joins
   both sides: compounds and ranges far outnumber spaced dashes (in RTE, 743 lines have ``a-b``
   and 111 ``a - b``; the Gutenberg books never write ``a - b``). Runs of two or more (``--``)
   join both sides wherever they stand: the Gutenberg books always write them unspaced
   (``ball--and``, ``said--'``), RTE's news dashes (``(AP) -- In``) lose their spaces. A single
   ``-`` elsewhere (a line starting with ``-``, next to punctuation) keeps its spaces.
8. Slashes join both sides (``and/or``, ``3/4``, ``http://``): ``text_standardize`` pads them,
   and spaced slashes are rare in prose.
9. Thousands separators: spaCy keeps ``1,000`` whole but ``text_standardize`` pads the comma
   first, giving ``1 , 000``. A comma between digits followed by exactly three digits joins (RTE
   has 272 such numbers and one list ``31, 127``; dates such as ``May 1, 2005`` have four digits
   and keep their space). Decimals such as ``3.5`` are never split.

Other padded characters (``* + ~ | \\``) keep their spaces: both forms are common (``x + y``,
``* * *``). ``detokenize`` is pure string processing and needs no vocabulary.
"""

from __future__ import annotations

import re

_NEWLINE = re.compile(r" *\n *")
# A quote mark standing alone as a token (contractions such as 's are tokens of their own).
_LONE_QUOTE = re.compile(r"""(?<![^ \n])["'_](?![^ \n])""")
# Words written with a leading apostrophe that spaCy splits off ("'tis" → "' tis").
_ELIDED_START = re.compile(r"(?:tis|twas|twere|twill)(?![^ \n])", re.IGNORECASE)
_QUOTE_MARKS = "\"'_"
_CLOSING = ".,;:!?)]}%"
_OPENING = "([{"
_CONTRACTION = re.compile(r" (n't|'s|'re|'ll|'ve|'m|'d)(?![^ \n])", re.IGNORECASE)
# spaCy's English exceptions split these spellings without an apostrophe ("dont" → "do nt",
# "wed" → "we d", "id" → "i d"): second piece → the words it follows. Rule 3 adds "can not".
_SPLIT_SPELLINGS = {
    "nt": "ai are ca could dare did do does had has have is may might must need ought sha should "
    "was were wo would",
    "d": "he how i it that there these they this those we what when where who why you",
    "ll": "how it that there these they this those what when where who why you",
    "re": "how there these they those what when where why you",
    "s": "he how she that there this what when where who why",
    "ve": "could how i might must not should there these they those we what when where who why would you",
    "m": "i",
    "na": "gon",
    "ta": "got",
    "all": "y'",
    "not": "can",
}
_SPLIT_PAIRS = {(first, second) for second, firsts in _SPLIT_SPELLINGS.items() for first in firsts.split()}
_SPLIT_WORDS = re.compile(
    rf"(?<![^ \n])([^ \n]+) ({'|'.join(_SPLIT_SPELLINGS)})(?![^ \n])(?! only\b)",  # see _join_split
    re.IGNORECASE,
)
# A spaced ellipsis (kept whole, space before it included) or a space before closing punctuation.
_SPACE_BEFORE_CLOSING = re.compile(
    r"((?<![^ \n])\.(?: \.){2,}(?![^ \n]))| (?=[.,;:!?)\]}%])(?!\.(?: \.){2,}(?![^ \n]))"
)
_SPACE_AFTER_OPENING = re.compile(r"(?<=[(\[{]) ")
_SPACE_AFTER_SIGN = re.compile(r"(?<=[$#]) (?=\d)")
_HYPHEN = re.compile(r"(?<=[A-Za-z0-9]) - (?=[A-Za-z0-9])")
_DASH = re.compile(r" ?(-{2,}) ?")
_SLASH = re.compile(r"(?<=[^ \n]) (/+) (?=[^ \n])")
_THOUSANDS = re.compile(r"(?<=\d), (?=\d{3}(?!\w))")


def detokenize(text: str) -> str:
    """Turn GPT-1's space-joined tokens (``decode``'s output) into text as a person writes it.

    ``" hello , " he said . i do n't know .`` → ``"hello," he said. i don't know.``
    The rules and the reasons for them are in this module's docstring.
    """
    text = _NEWLINE.sub("\n", text.strip(" "))
    text = _CONTRACTION.sub(r"\1", text)
    text = _SPLIT_WORDS.sub(_join_split, text)
    text = _attach_quotes(text)  # after the contractions, so "won't'" closes a quote after a word
    text = _SPACE_BEFORE_CLOSING.sub(lambda match: match.group(1) or "", text)
    text = _SPACE_AFTER_OPENING.sub("", text)
    text = _SPACE_AFTER_SIGN.sub("", text)
    text = _HYPHEN.sub("-", text)
    text = _DASH.sub(r"\1", text)
    text = _SLASH.sub(r"\1", text)
    text = _THOUSANDS.sub(",", text)
    return text


def _join_split(match: re.Match[str]) -> str:
    """``do nt`` → ``dont`` where the pair is one of spaCy's splits; other pairs stay as they are.
    ``can not only`` never reaches here: it means something else than ``cannot only``."""
    first, second = match.groups()
    if (first.lower(), second.lower()) in _SPLIT_PAIRS:
        return first + second
    return match.group()


def _attach_quotes(text: str) -> str:
    """Remove the space inside each lone quote mark: after an opening one, before a closing one."""
    pieces: list[str] = []
    is_open = {'"': False, "'": False, "_": False}
    start = 0  # text[start:] is still to be copied
    for match in _LONE_QUOTE.finditer(text):
        mark, at = match.group(), match.start()
        before, after = _context_before(text, at), _context_after(text, at)
        if not after or after in _CLOSING:
            opens = False
        elif not before or before in _OPENING:
            opens = True
        elif mark == "'" and _ELIDED_START.match(text, at + 2):
            pieces.append(text[start : at + 1])  # 'tis, 'twas: attach to the word after
            start = at + 2
            continue
        elif mark == "'" and not is_open["'"] and _is_apostrophe(text, at):
            opens = None  # attach to the word before, and leave the quote state alone
        else:
            opens = not is_open[mark]
        if opens:
            pieces.append(text[start : at + 1])
            start = at + 2  # an opening mark is never last on its line, so a space follows
        else:
            cut = at - 1 if at > 0 and text[at - 1] == " " else at
            pieces.append(text[start:cut])
            start = at
        if opens is not None:
            is_open[mark] = opens
    pieces.append(text[start:])
    return "".join(pieces)


def _context_before(text: str, at: int) -> str:
    """The last character of the token before the quote mark at ``at``, looking past other lone
    marks (so ``( " '`` opens both); "" at the start of a line."""
    while at >= 2 and text[at - 1] == " ":
        at -= 2
        if text[at] not in _QUOTE_MARKS or (at > 0 and text[at - 1] not in " \n"):
            return text[at]
    return ""


def _context_after(text: str, at: int) -> str:
    """The first character of the token after the quote mark at ``at``, looking past other lone
    marks (so ``? " '`` at the end closes both); "" at the end of a line."""
    while at + 2 < len(text) and text[at + 1] == " ":
        at += 2
        if text[at] not in _QUOTE_MARKS or (at + 1 < len(text) and text[at + 1] not in " \n"):
            return text[at]
    return ""


def _is_apostrophe(text: str, at: int) -> bool:
    """Whether the ``'`` at ``at``, between two words, ends the word before it: a plural possessive
    (``students' books``) or a dropped g (``nothin' more``), rather than opening a quotation."""
    word_end = text[max(0, at - 3) : at - 1].lower()
    return word_end.endswith("s") or word_end == "in"
