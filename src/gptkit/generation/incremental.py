"""A continuation's text as its tokens arrive: what can be shown now, and where a stop string ends it.

Used by every streaming door (``stream_text``, ``gptkit generate``, the server), so they all cut
and join text the same way.

Each token costs about the same however long the continuation is (the server pushes one per
sequence per step). The text is kept as a *frozen* part, which no later token can change, and the
text of the few tokens since the last *cut*: a place where the decoded text provably splits into
the text before it and the text after it, whatever comes next. Only the tokens since the cut are
decoded again; stop strings are searched only where the text changed. The cuts are exact, so every
piece sent is the one decoding the whole continuation each time would send (the tests check it
against that algorithm). Where a cut is only known to be safe for one tokenizer's decode (a UTF-8
character split across tokens, GPT-1's ``</w>`` and its detokenizer), a tokenizer this module does
not know never cuts, and costs what decoding everything does.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence

from gptkit.tokenizer import ByteLevelTokenizer, GPT1Tokenizer, Tokenizer, detokenize
from gptkit.tokenizer.gpt1 import END_OF_WORD

# Tokens held back by a tokenizer whose readable text rewrites its end as tokens arrive (GPT-1's
# detokenizer: "well -" becomes "well-known", an opening quote attaches to the next word).
REWRITING_HOLD_BACK = 2


class IncrementalText:
    """Decode a growing list of token ids into text that is safe to send piece by piece.

    Text is held back while it ends in half of a multi-byte character (``\\ufffd``), in the start of
    a stop string (a stop string is never sent, even in part), or, for a tokenizer whose readable
    text rewrites its end (GPT-1's), within the last ``REWRITING_HOLD_BACK`` tokens: only what the
    text already read that many tokens ago is sent. The continuation is decoded after the last
    prompt token, so a tokenizer whose word boundaries live on the previous token (GPT-1's ``</w>``)
    joins the first word right. ``raw``: the tokenizer's raw text (``decode``), not the readable one.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stop: Sequence[str] = (), raw: bool = False
    ):
        rewrites = not raw and type(tokenizer).decode_text is not Tokenizer.decode_text
        self.hold_back = REWRITING_HOLD_BACK if rewrites else 0
        self.window = _window(tokenizer, prompt_ids, raw)
        self.stop = [s for s in stop if s]
        self.longest_stop = max(map(len, self.stop), default=0)
        # The decoded text after each of the last pushes (and before the first), as (frozen length,
        # unfrozen text): the text is window.frozen[:length] + unfrozen, the frozen part only grows.
        self.recent: deque[tuple[int, str]] = deque([(0, "")], maxlen=max(self.hold_back, 1) + 1)
        self.sent = _Chunks()
        # The text sent disagrees with the frozen text (a rewrite after it was sent): no later text
        # can continue it, so nothing more is sent.
        self.stale = False
        self.stopped = False

    @property
    def text(self) -> str:
        """The text sent so far."""
        return str(self.sent)

    def push(self, token_id: int) -> str:
        """Add a token; return the new text that can be sent (``stopped`` says if a stop string came)."""
        if self.stopped:
            return ""
        frozen_before = len(self.window.frozen)
        self.window.push(token_id)
        self._check_sent(frozen_before)
        now = (len(self.window.frozen), self.window.unfrozen)
        previous = self.recent[-1]
        self.recent.append(now)
        cut = self._cut_at_stop(previous, now)
        if cut >= 0:
            self.stopped = True
            return self._send(cut)
        end = _length(now)
        if self.hold_back:  # what the text already read hold_back tokens ago
            end = self._common_prefix(self.recent[0], now)
        end = self._before_replacements(now, end)  # a character still arriving
        if self.longest_stop > 1:
            end -= self._stop_prefix(self._slice(now, max(end - self.longest_stop + 1, 0), end))
        return self._send(end)

    def flush(self) -> str:
        """At the end without a stop string: everything left, incomplete characters included."""
        return "" if self.stopped else self._send(_length(self.recent[-1]))

    def _slice(self, decoded: tuple[int, str], start: int, end: int) -> str:
        """``decoded``'s text[start:end] (a text of ``recent``), reading only that part."""
        frozen_length, unfrozen = decoded
        head = self.window.frozen.slice(start, min(end, frozen_length)) if start < frozen_length else ""
        return head + unfrozen[max(start - frozen_length, 0) : max(end - frozen_length, 0)]

    def _common_prefix(self, older: tuple[int, str], newer: tuple[int, str]) -> int:
        # Both begin with the frozen text as it was at the older one: compare only what follows.
        start = min(older[0], newer[0])
        texts = [self._slice(decoded, start, _length(decoded)) for decoded in (older, newer)]
        return start + len(os.path.commonprefix(texts))

    def _cut_at_stop(self, previous: tuple[int, str], now: tuple[int, str]) -> int:
        """Where the first stop string starts in the text, or -1. A stop string ending within the
        text the previous push had too would have stopped that push: only the rest is searched."""
        if not self.stop:
            return -1
        start = max(self._common_prefix(previous, now) - self.longest_stop + 1, 0)
        region = self._slice(now, start, _length(now))
        cuts = [region.find(s) for s in self.stop]
        return min((start + c for c in cuts if c >= 0), default=-1)

    def _before_replacements(self, decoded: tuple[int, str], end: int) -> int:
        """``end`` moved back over the U+FFFD characters (half a character) just before it."""
        size = 16
        while True:  # longer reads only for a long run of undecodable bytes
            start = max(end - size, 0)
            kept = len(self._slice(decoded, start, end).rstrip("\ufffd"))
            if kept or start == 0:
                return start + kept
            size *= 4

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest end of ``text`` that starts a stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _send(self, end: int) -> str:
        """Send the text up to ``end`` of the latest decoded text, if it continues what was sent."""
        # Text already sent cannot be taken back: if a rewrite changed it, wait until the text again
        # continues what was sent.
        sent, now = len(self.sent), self.recent[-1]
        if self.stale or end <= sent:
            return ""
        frozen_length, unfrozen = now  # the sent text's frozen part was compared as it froze
        if sent > frozen_length and unfrozen[: sent - frozen_length] != self.sent.slice(frozen_length, sent):
            return ""
        new = self._slice(now, sent, end)
        self.sent.append(new)
        return new

    def _check_sent(self, frozen_before: int) -> None:
        """Compare the text sent with the text that just froze."""
        end = min(len(self.sent), len(self.window.frozen))
        if not self.stale and end > frozen_before:
            self.stale = self.sent.slice(frozen_before, end) != self.window.frozen.slice(frozen_before, end)


def _length(decoded: tuple[int, str]) -> int:
    return decoded[0] + len(decoded[1])


class _Chunks:
    """A growing text kept as pieces of about ``_PIECE`` characters: appending, and reading near the
    end, cost what they touch, not the whole text's length."""

    def __init__(self) -> None:
        self.pieces: list[str] = []  # the text before ``last``
        self.pieces_length = 0
        self.last = ""

    def __len__(self) -> int:
        return self.pieces_length + len(self.last)

    def __str__(self) -> str:
        return "".join(self.pieces) + self.last

    def append(self, piece: str) -> None:
        self.last += piece
        if len(self.last) > _PIECE:
            self.pieces.append(self.last)
            self.pieces_length += len(self.last)
            self.last = ""

    def slice(self, start: int, end: int) -> str:
        """text[start:end], read from the end back to ``start``."""
        at = self.pieces_length  # where the parts read so far begin
        parts = [self.last[max(start - at, 0) : max(end - at, 0)]]
        for piece in reversed(self.pieces):
            if at <= start:
                break
            at -= len(piece)
            parts.append(piece[max(start - at, 0) : max(end - at, 0)])
        return "".join(reversed(parts))


_PIECE = 4096


def _window(tokenizer: Tokenizer, prompt_ids: Sequence[int], raw: bool) -> _Window:
    """The window for this tokenizer's decode: one that knows where its text can be cut, or one
    that decodes everything (a tokenizer, or an override of decode, this module does not know)."""
    kind = type(tokenizer)
    if isinstance(tokenizer, ByteLevelTokenizer) and kind.decode is ByteLevelTokenizer.decode:
        if raw or kind.decode_text is Tokenizer.decode_text:
            return _Utf8Window(tokenizer, prompt_ids, raw)
    if isinstance(tokenizer, GPT1Tokenizer) and kind.decode is GPT1Tokenizer.decode:
        if raw:
            return _Gpt1Window(tokenizer, prompt_ids, raw)
        if kind.decode_text is GPT1Tokenizer.decode_text:
            return _Gpt1ReadableWindow(tokenizer, prompt_ids, raw)
    return _Window(tokenizer, prompt_ids, raw)


class _Window:
    """The decoded continuation as ``frozen`` text, which no later token changes, then ``unfrozen``,
    the text of ``tokens[start:]``, the tokens since the last cut.

    ``tokens`` is the prompt's last token (the context) then the continuation. Until the first cut
    the continuation is decoded whole, after the context, as it always was; the first cut also fixes
    whether the text is decoded with the context or, when the context's text was rewritten (the
    context ends in half a character that the continuation completes), without it: the *track*.
    A cut at ``q`` means: for every later length, the track's text of ``tokens[:length]`` is the
    text of ``tokens[:q]``, a joiner (a space, or nothing), and the text of ``tokens[q:length]``
    decoded alone. Subclasses say where a cut may be; this base never cuts.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], raw: bool):
        self.tokenizer = tokenizer
        self.decode: Callable[[list[int]], str] = tokenizer.decode if raw else tokenizer.decode_text
        self.tokens: list[int] = list(prompt_ids[-1:])
        self.context_length = len(self.tokens)
        self.context_text = self.decode(self.tokens) if self.tokens else ""
        self.frozen = _Chunks()
        self.unfrozen = ""
        self.start: int | None = None  # None until the first cut
        self.track = 0  # the index where the track's tokens begin: 0 (with the context) or 1

    def push(self, token_id: int) -> None:
        self.tokens.append(token_id)
        if self.start is None:
            self._push_before_cut()
            return
        self.unfrozen = self._render(self.start)
        q = self._cut_candidate()
        if q is not None and q > self.start and self._cut_valid(q, self.track):
            tail = self._tail(q)
            if self.unfrozen.endswith(tail):  # always, where the cut is valid
                self._freeze(q, self.unfrozen[: len(self.unfrozen) - len(tail)], tail)

    def _push_before_cut(self) -> None:
        full = self.decode(self.tokens)
        with_context = full.startswith(self.context_text)
        ids = self.tokens[self.context_length :]
        self.unfrozen = full[len(self.context_text) :] if with_context else self.decode(ids)
        track = 0 if with_context else self.context_length
        q = self._cut_candidate()
        if q is None or q <= track or not self._cut_valid(q, track):
            return
        tail = self._tail(q)
        head = full[: len(full) - len(tail)]  # the text with the context, up to the cut
        if not (full.endswith(tail) and self.unfrozen.endswith(tail)):
            return
        if len(head) < len(self.context_text):
            return  # what follows may still decide whether the text begins with the context's text
        if not with_context and not self._cut_valid(q, 0):
            return  # the text with the context must split there too, to never begin with its text
        self.track = track
        self._freeze(q, self.unfrozen[: len(self.unfrozen) - len(tail)], tail)

    def _freeze(self, q: int, piece: str, tail: str) -> None:
        """Cut before ``tokens[q]``: ``piece`` (joiner included) freezes, ``tail`` is what is left."""
        self.frozen.append(piece)
        self.unfrozen = tail
        self.start = q

    def _cut_candidate(self) -> int | None:
        """Where the newest token may allow a cut (called once per push), or None."""
        return None

    def _cut_valid(self, q: int, track: int) -> bool:
        raise NotImplementedError

    def _render(self, start: int) -> str:
        """The track's text of ``tokens[start:]``, ``start`` being the last cut."""
        return self.tokenizer.decode(self.tokens[start:])

    def _tail(self, q: int) -> str:
        """The text of ``tokens[q:]`` decoded alone."""
        return self.tokenizer.decode(self.tokens[q:])


class _Utf8Window(_Window):
    """GPT-2's byte-level BPE: the text is the UTF-8 decoding (U+FFFD for bad bytes) of the tokens'
    bytes. The decoder reads a character of at most 4 bytes, so a token's first byte starts a new
    character, or belongs to one begun at most 3 bytes (so 3 tokens) before it: a cut before a token
    is valid when decoding it together with the 3 tokens before gives the same as decoding it alone."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], raw: bool):
        super().__init__(tokenizer, prompt_ids, raw)
        self.texts: dict[int, str] = {}  # a token's text alone

    def _text_of(self, token_id: int) -> str:
        text = self.texts.get(token_id)
        if text is None:
            text = self.texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def _cut_candidate(self) -> int | None:
        return len(self.tokens) - 1

    def _cut_valid(self, q: int, track: int) -> bool:
        if q <= track:
            return False
        text = self._text_of(self.tokens[q])
        if not text.startswith("\ufffd"):  # its first byte begins a character: nothing can take it
            return True
        first = max(track, q - 3)
        decode = self.tokenizer.decode
        return decode(self.tokens[first : q + 1]) == decode(self.tokens[first:q]) + text

    def push(self, token_id: int) -> None:
        if self.start is None:
            super().push(token_id)
            return
        self.tokens.append(token_id)
        q = len(self.tokens) - 1
        if self._cut_valid(q, self.track):  # the text before the new token is the unfrozen text
            self._freeze(q, self.unfrozen, self._text_of(token_id))
        else:
            self.unfrozen = self.tokenizer.decode(self.tokens[self.start :])

    def _tail(self, q: int) -> str:
        return self._text_of(self.tokens[q])  # q is the newest token


class _Gpt1Window(_Window):
    """GPT-1's raw text: the tokens' strings joined, each ``</w>`` made a space, then stripped. Before
    a token that follows one ending in ``</w>`` (so no ``</w>`` spelled across tokens, "<" "/" "w" ">",
    spans the cut) and that begins with neither whitespace nor "<" (which the strip could take, the
    second as the start of a ``</w>``), the text splits into the text before, its trailing spaces and
    newlines, and the text after."""

    def _string(self, index: int) -> str:
        return self.tokenizer.decoder[int(self.tokens[index])]

    def _cut_candidate(self) -> int | None:
        return len(self.tokens) - 1

    def _cut_valid(self, q: int, track: int) -> bool:
        after = self._string(q)
        return (
            q > track
            and self._string(q - 1).endswith(END_OF_WORD)
            and not (after[:1].isspace() or after.startswith("<"))
        )


# GPT-1's quote marks, each opened or closed by the detokenizer's count of the marks before it (the
# context decides only next to a line's ends, brackets and punctuation), so a window's text depends
# on the state left by the text before it: the window is decoded after lines that recreate that
# state, and the state at a cut is read from probe lines after the text.
_QUOTE_MARKS = ('"', "'", "_")
_PROBE = "".join(f"\nx {mark} y" for mark in _QUOTE_MARKS)
# spaCy's split pieces that the detokenizer joins to the word before ("do nt" → "dont", "can not"),
# and "only", which it looks ahead to, are all shorter than this: a longer ASCII word is joined to
# neither neighbour.
_INERT_WORD = 5


class _Gpt1ReadableWindow(_Gpt1Window):
    """GPT-1's readable text, ``detokenize`` of the raw text. Its rules join a word to its neighbours
    by looking at the characters around a space: quote marks (past any run of other marks),
    punctuation, dashes, slashes, digits, contractions and spaCy's split pieces. A cut is made only
    between two whole words of letters and digits, the second of at least ``_INERT_WORD`` ASCII
    characters: no rule joins across such a space, and the only state carried over it is which
    quote marks are open."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], raw: bool):
        super().__init__(tokenizer, prompt_ids, raw)
        self.open_marks = (False,) * len(_QUOTE_MARKS)  # the detokenizer's state at the last cut
        self.raw_text = ""  # decode(tokens[start:])
        self.cuts = True  # False: a probe gave an unexpected answer (a changed detokenizer)
        self.scanned = 0  # tokens whose words were followed
        self.word = (0, True, True, 0)  # the word being read: start, alphanumeric, ASCII, length
        self.last_word: tuple[int, bool] | None = None  # the last whole word: start, alphanumeric
        self.left_start = 0  # where the word before the candidate cut begins

    def _cut_candidate(self) -> int | None:
        candidate = None
        while self.scanned < len(self.tokens):
            string = self._string(self.scanned)
            self.scanned += 1
            ends = string.endswith(END_OF_WORD)
            core = string[: -len(END_OF_WORD)] if ends else string
            start, alphanumeric, ascii_only, length = self.word
            alphanumeric = alphanumeric and core.isalnum()
            ascii_only, length = ascii_only and core.isascii(), length + len(core)
            self.word = (start, alphanumeric, ascii_only, length)
            if not ends:
                continue
            inert = alphanumeric and ascii_only and length >= _INERT_WORD
            if self.last_word is not None and self.last_word[1] and inert:
                candidate, self.left_start = start, self.last_word[0]
            self.last_word = (start, alphanumeric)
            self.word = (self.scanned, True, True, 0)
        return candidate if self.cuts else None

    def _cut_valid(self, q: int, track: int) -> bool:
        return self.left_start >= track

    def _render(self, start: int) -> str:
        self.raw_text = self.tokenizer.decode(self.tokens[start:])
        return _readable(self.raw_text, self.open_marks)

    def _freeze(self, q: int, piece: str, tail: str) -> None:
        if self.start is None:
            raw_text = self.tokenizer.decode(self.tokens[self.track : q])
        else:  # the window's raw text is this, a space, then the tail
            raw_text = self.raw_text[: len(self.raw_text) - len(tail) - 1]
        open_marks = _open_marks_after(raw_text, self.open_marks)
        if open_marks is None:
            self.cuts = False
            return
        self.open_marks = open_marks
        super()._freeze(q, piece, tail)


def _readable(raw_text: str, open_marks: tuple[bool, ...]) -> str:
    """``detokenize(raw_text)`` with the quote marks flagged in ``open_marks`` open before it: each
    opened by a line of its own (a mark starting a line opens), whose text is then dropped."""
    opened = [mark for mark, is_open in zip(_QUOTE_MARKS, open_marks) if is_open]
    if not opened:
        return detokenize(raw_text)
    text = detokenize("".join(f"{mark} x\n" for mark in opened) + raw_text)
    return text.split("\n", len(opened))[-1]


def _open_marks_after(raw_text: str, open_marks: tuple[bool, ...]) -> tuple[bool, ...] | None:
    """Which quote marks are open after ``raw_text`` (read from ``open_marks``): a probe line
    "x <mark> y" after it closes the mark (``x" y``) if it is open, and opens it (``x "y``) if not.
    None if a probe line reads neither way."""
    lines = _readable(raw_text + _PROBE, open_marks).split("\n")[-len(_QUOTE_MARKS) :]
    if any(line not in (f"x{mark} y", f"x {mark}y") for line, mark in zip(lines, _QUOTE_MARKS)):
        return None
    return tuple(line == f"x{mark} y" for line, mark in zip(lines, _QUOTE_MARKS))


def _decode_after(
    decode: Callable[[list[int]], str], context: list[int], context_text: str, ids: list[int]
) -> str:
    """The text ``ids`` add after ``context`` (whose text is ``context_text``): decoded together, so
    that a word boundary carried by the context's last token (GPT-1's ``</w>``) is kept."""
    full = decode(context + ids)
    if full.startswith(context_text):
        return full[len(context_text) :]
    return decode(ids)


def token_pieces(
    tokenizer: Tokenizer, ids: Sequence[int], text: str, context: Sequence[int] = (), raw: bool = False
) -> list[str]:
    """Cut ``text``, what ``ids`` came out as (after ``context``'s last token, as
    :class:`IncrementalText` decodes), into one piece per token: the pieces add up to ``text``, so
    offsets counted over them index it, as OpenAI's logprobs do.

    Token k's piece is what decoding the tokens up to k adds to the part of ``text`` they account for:
    a character still arriving, or a GPT-1 word its detokenizer is still joining, goes to the token
    that completes it; whatever is left (text the stop string cut, a rewrite) goes to the last token.
    """
    decode = tokenizer.decode if raw else tokenizer.decode_text
    context = list(context[-1:])
    context_text = decode(context) if context else ""
    ids = list(ids)
    pieces, start = [], 0
    for k in range(1, len(ids) + 1):
        if k == len(ids):
            end = len(text)
        else:
            decoded = _decode_after(decode, context, context_text, ids[:k])
            end = max(start, len(os.path.commonprefix([decoded, text])))
        pieces.append(text[start:end])
        start = end
    return pieces
