"""A completion's text as its tokens arrive: what can be sent now, and where a stop string ends it."""

from __future__ import annotations

from collections.abc import Sequence

from gptkit.tokenizer import Tokenizer


class IncrementalText:
    """Decode a growing list of token ids into text that is safe to send piece by piece.

    Text is held back while it ends in half of a multi-byte character (``\\ufffd``) or in the start of
    a stop string, so a stop string is never sent, even in part. The completion is decoded after the
    last prompt token, so a tokenizer whose word boundaries live on the previous token (GPT-1's
    ``</w>``) joins the first word right.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.context = list(prompt_ids[-1:])
        self.context_text = tokenizer.decode_text(self.context) if self.context else ""
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # the text sent so far
        self.stopped = False

    def _decode(self) -> str:
        full = self.tokenizer.decode_text(self.context + self.ids)
        if full.startswith(self.context_text):
            return full[len(self.context_text) :]
        return self.tokenizer.decode_text(self.ids)

    def push(self, token_id: int) -> str:
        """Add a token; return the new text that can be sent (``stopped`` says if a stop string came)."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        decoded = self._decode()
        if self.stop:
            cuts = [decoded.find(s) for s in self.stop]
            cut = min((c for c in cuts if c >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                return self._send(decoded, cut)
        end = len(decoded)
        if decoded.endswith("\ufffd"):
            end -= 1
        return self._send(decoded, end - self._stop_prefix(decoded[:end]))

    def flush(self) -> str:
        """At the end without a stop string: everything left, incomplete characters included."""
        return "" if self.stopped else self._send(self._decode(), None)

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest end of ``text`` that starts a stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _send(self, decoded: str, end: int | None) -> str:
        part = decoded[:end] if end is not None else decoded
        # A tokenizer that rewrites earlier text (GPT-1's detokenizer) cannot take back what was
        # sent: wait until the text again continues it.
        if not part.startswith(self.text) or len(part) <= len(self.text):
            return ""
        new = part[len(self.text) :]
        self.text = part
        return new
