"""``POST /v1/chat/completions``: OpenAI's chat API over the same engine as ``/v1/completions``.

The messages become the prompt through the model's chat template (``chat_template.jinja`` beside its
weights, as `gptkit finetune --task generation` writes it): the same text `gptkit generate` and
transformers' ``apply_chat_template`` make of them. A model without a template answers 400, naming
what it lacks. The sampling fields are the completions endpoint's (checked by the same parser);
``max_completion_tokens`` is ``max_tokens``' newer name; ``logprobs`` is a boolean and
``top_logprobs`` the alternatives a token, answered in the chat API's shape (``content``: a token,
its log P, its bytes and its alternatives).

The answer is the text after the template's ``Assistant:``, without the one space the template puts
before it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gptkit.generation.incremental import token_pieces
from gptkit.generation.sampling import MAX_LOGPROBS
from gptkit.serve.endpoints import (
    Completion,
    ServerState,
    authorized_request,
    engine_error,
    finished,
    sse_data,
    submit,
)
from gptkit.serve.engine import Engine, Event
from gptkit.serve.models import CHAT_COMPLETIONS, ServedModel
from gptkit.serve.protocol import APIError, bad_request, check_context, parse_completion_request
from gptkit.serve.responses import Choice, usage
from gptkit.tokenizer import END_OF_TEXT, Tokenizer
from gptkit.tokenizer.chat_template import TemplateError, render_chat

# The completions fields a chat request shares (checked there), and the chat API's own.
_SHARED = {
    "model", "temperature", "top_p", "top_k", "repetition_penalty", "n", "stream", "stream_options",
    "stop", "seed", "user", "presence_penalty", "frequency_penalty", "logit_bias",
}  # fmt: skip
_FIELDS = {*_SHARED, "messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs"}


def completions_body(body: Any, prompt: str) -> dict:
    """The chat body as the completions parser reads it: the rendered ``prompt``, ``max_tokens``,
    and ``logprobs`` as a count of alternatives (None without logprobs)."""
    for name in body:
        if name not in _FIELDS:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    translated = {name: body[name] for name in _SHARED if name in body}
    translated["prompt"] = prompt
    for name in ("max_completion_tokens", "max_tokens"):  # the newer name wins where both are given
        if body.get(name) is not None:
            translated["max_tokens"] = body[name]
            break
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad_request("'logprobs' must be a boolean", "logprobs")
    if top is not None:
        if not logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs' to be true", "top_logprobs")
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS:
            raise bad_request(f"'top_logprobs' must be an integer from 0 to {MAX_LOGPROBS}", "top_logprobs")
    if logprobs:
        translated["logprobs"] = top or 0
    return translated


def prompt_of(served: ServedModel, body: dict) -> str:
    """The conversation as the model reads it, ending where the assistant's answer begins."""
    if served.chat_template is None:
        raise APIError(
            400,
            f"The model `{served.name}` has no chat template (chat_template.jinja beside its weights, "
            "which `gptkit finetune --task generation` writes): send its prompts to /v1/completions",
            param="model",
            code="chat_template_missing",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise bad_request("'messages' must be an array of objects with 'role' and 'content'", "messages")
    try:
        return render_chat(served.chat_template, messages, END_OF_TEXT)
    except TemplateError as e:
        raise bad_request(str(e), "messages") from None


def chat_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text``'s ids, the end-of-text token where the template wrote it (between earlier turns)."""
    end = tokenizer.special_tokens.get(END_OF_TEXT)
    pieces = text.split(END_OF_TEXT) if end is not None else [text]
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        ids += ([end] if i else []) + tokenizer.encode(piece)
    return ids


async def chat_complete(server: ServerState, http: Request) -> Response:
    """``POST /v1/chat/completions``: render, check, queue, then answer whole or as a stream."""
    body, served = await authorized_request(server, http, CHAT_COMPLETIONS)
    engine = served.engine
    prompt = prompt_of(served, body)
    request = parse_completion_request(
        completions_body(body, prompt), server.limits, engine.model.config.total_vocab_size
    )
    ids = chat_ids(engine.tokenizer, prompt)
    check_context(ids, request.params.max_tokens, engine.model.config.context_length)
    completion = Completion(http, request, [(ids, prompt)], server.limits.request_timeout, engine.clock)
    completion.id = f"chatcmpl-{uuid.uuid4().hex}"
    submit(engine, completion)
    answer = ChatAnswer(completion, engine.tokenizer, served.name, request.params.logprobs is not None)
    if request.stream:
        return StreamingResponse(
            answer.events(engine), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    if not await finished(completion, engine):  # the client left: nobody reads this
        return Response(status_code=499)
    return JSONResponse(answer.whole())


class ChatAnswer:
    """A chat request's answer in the chat API's shape, whole or as chunks."""

    def __init__(self, completion: Completion, tokenizer: Tokenizer, model: str, with_logprobs: bool):
        self.completion, self.tokenizer, self.model = completion, tokenizer, model
        self.with_logprobs = with_logprobs
        self.started = [False] * len(completion.choices)  # a choice's first text is sent

    def _header(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.completion.id,
            "object": kind,
            "created": self.completion.created,
            "model": self.model,
        }

    def _logprobs(self, scored: list, pieces: list[str]) -> dict[str, Any]:
        content = []
        for token, piece in zip(scored, pieces, strict=True):
            top = [
                {"token": text, "logprob": lp, "bytes": list(text.encode())}
                for text, lp in ((self.tokenizer.decode([t]), lp) for t, lp in token.top or [])
            ]
            content.append(
                {"token": piece, "logprob": token.logprob, "bytes": list(piece.encode()), "top_logprobs": top}
            )
        return {"content": content}

    def whole(self) -> dict[str, Any]:
        """The response of a request that did not stream."""
        bodies = []
        for choice in self.completion.choices:
            logprobs = None
            if self.with_logprobs:
                ids = [token for token, _ in choice.scored]
                pieces = token_pieces(self.tokenizer, ids, choice.text, context=choice.prompt_ids)
                logprobs = self._logprobs([scored for _, scored in choice.scored], pieces)
            message = {"role": "assistant", "content": _answer(choice.text)}
            bodies.append(
                {
                    "index": choice.index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": choice.finish_reason,
                }
            )
        completion_tokens = sum(c.completion_tokens for c in self.completion.choices)
        return {
            **self._header("chat.completion"),
            "choices": bodies,
            "usage": usage(self.completion.prompt_tokens, completion_tokens),
        }

    def _chunk(self, index: int, delta: dict, logprobs: dict | None = None, finish: str | None = None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return sse_data({**self._header("chat.completion.chunk"), "choices": [choice]})

    def _event(self, event: Event) -> str:
        if event.error is not None:
            return sse_data(engine_error(event.error).body())
        choice: Choice = self.completion.choices[event.index]
        text = event.text
        if text and not self.started[event.index]:
            text, self.started[event.index] = _answer(text), True
        logprobs = None
        if self.with_logprobs and event.token_id is not None and event.logprob is not None:
            logprobs = self._logprobs([event.logprob], [text])
        data = ""
        if text or logprobs is not None:
            data += self._chunk(choice.index, {"content": text}, logprobs)
        if event.finish_reason is not None:
            data += self._chunk(choice.index, {}, finish=event.finish_reason)
        return data

    async def events(self, engine: Engine) -> AsyncIterator[str]:
        """The server-sent events: each choice's role, its text as it comes, its finish, then
        (asked for) the usage and ``data: [DONE]``."""
        completion = self.completion
        yield "".join(self._chunk(c.index, {"role": "assistant", "content": ""}) for c in completion.choices)
        async for events in completion.stream_events(engine):
            data = "".join(self._event(event) for event in events)
            if data:
                yield data
        if not all(choice.done for choice in completion.choices):
            return  # the client went away
        if completion.request.include_usage:
            tokens = sum(c.completion_tokens for c in completion.choices)
            yield sse_data(
                {
                    **self._header("chat.completion.chunk"),
                    "choices": [],
                    "usage": usage(completion.prompt_tokens, tokens),
                }
            )
        yield sse_data("[DONE]")


def _answer(text: str) -> str:
    """The answer without the space the template writes after ``Assistant:``."""
    return text[1:] if text.startswith(" ") else text
