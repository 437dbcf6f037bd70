"""A continuation's text as its tokens arrive: what can be shown now, and where a stop string ends it.

Used by every streaming door (``stream_text``, ``gptkit generate``, the server), so they all cut
and join text the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from gptkit.tokenizer import Tokenizer

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
        self.decode = tokenizer.decode if raw else tokenizer.decode_text
        rewrites = not raw and type(tokenizer).decode_text is not Tokenizer.decode_text
        self.hold_back = REWRITING_HOLD_BACK if rewrites else 0
        self.context = list(prompt_ids[-1:])
        self.context_text = self.decode(self.context) if self.context else ""
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.recent: list[str] = []  # the decoded text after each of the last hold_back + 1 tokens
        self.text = ""  # the text sent so far
        self.stopped = False

    def _decode(self) -> str:
        return _decode_after(self.decode, self.context, self.context_text, self.ids)

    def _cut_at_stop(self, decoded: str) -> int:
        cuts = [decoded.find(s) for s in self.stop]
        return min((c for c in cuts if c >= 0), default=-1)

    def push(self, token_id: int) -> str:
        """Add a token; return the new text that can be sent (``stopped`` says if a stop string came)."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        decoded = self._decode()
        self.recent = [*self.recent[-self.hold_back :], decoded] if self.hold_back else [decoded]
        cut = self._cut_at_stop(decoded)
        if cut >= 0:
            self.stopped = True
            return self._send(decoded[:cut])
        stable = decoded
        if self.hold_back:
            older = self.recent[0] if len(self.recent) > self.hold_back else ""
            stable = decoded[: len(os.path.commonprefix([decoded, older]))]
        stable = stable.rstrip("\ufffd")  # a character still arriving
        return self._send(stable[: len(stable) - self._stop_prefix(stable)])

    def flush(self) -> str:
        """At the end without a stop string: everything left, incomplete characters included."""
        return "" if self.stopped else self._send(self._decode())

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest end of ``text`` that starts a stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _send(self, part: str) -> str:
        # Text already sent cannot be taken back: if a rewrite changed it, wait until the text again
        # continues what was sent.
        if not part.startswith(self.text) or len(part) <= len(self.text):
            return ""
        new = part[len(self.text) :]
        self.text = part
        return new


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
