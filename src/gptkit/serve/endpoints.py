"""The work behind the server's endpoints: read and check a request, hand it to the model it names,
and answer whole or as a stream of server-sent events. Completions go to the model's engine (one
request's sequences decoded with everyone else's); classification and embeddings to its batcher.
A request whose client has gone stops waiting and frees its place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from gptkit.data.formats import DataError
from gptkit.generation import start_ids
from gptkit.serve.batcher import Batcher, BatchFailed
from gptkit.serve.config import ServeLimits
from gptkit.serve.engine import Engine, EngineStopped, Event, GenerationRequest, QueueFull
from gptkit.serve.models import CLASSIFY, COMPLETIONS, EMBEDDINGS, ServedModel
from gptkit.serve.pooling_protocol import parse_classify_request, parse_embedding_request
from gptkit.serve.protocol import (
    APIError,
    CompletionRequest,
    bad_request,
    check_context,
    parse_completion_request,
    requested_model,
)
from gptkit.serve.responses import (
    Choice,
    LogprobsWriter,
    chunk_body,
    classification_body,
    completion_body,
    embeddings_body,
    usage,
)

logger = logging.getLogger("gptkit.serve")

_POLL_SECONDS = 0.25  # how often a waiting request looks for its client having gone
_ENGINE_ERRORS = {  # an engine "error" event → the HTTP answer
    "timeout": (
        408,
        "the request ran past the server's time limit (--request-timeout)",
        "timeout",
        "request_timeout",
    ),
    "shutdown": (503, "the server is shutting down", "server_error", "shutting_down"),
    "internal": (500, "the model failed while decoding this request", "server_error", None),
}


def engine_error(kind: str) -> APIError:
    status, message, type_, code = _ENGINE_ERRORS[kind]
    return APIError(status, message, type=type_, code=code)


@dataclasses.dataclass(frozen=True)
class ServerState:
    """What the endpoints share."""

    models: dict[str, ServedModel]  # by name, in the order given
    limits: ServeLimits
    api_key: str | None
    created: int  # when the server started, the models' "created"


def check_api_key(http: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    scheme, _, token = http.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise APIError(
            401,
            "You didn't provide an API key: send it as 'Authorization: Bearer YOUR_KEY'",
            code="invalid_api_key",
        )
    # Constant time: how long the comparison takes says nothing about the key.
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "Incorrect API key provided", code="invalid_api_key")


def model_card(server: ServerState, model: ServedModel) -> dict:
    """OpenAI's model object; gptkit adds the endpoints that answer for it and, for a fine-tuned
    model, its task."""
    card: dict[str, Any] = {
        "id": model.name,
        "object": "model",
        "created": server.created,
        "owned_by": "gptkit",
    }
    card["endpoints"] = list(model.endpoints)
    if model.task is not None:
        spec = model.task.spec
        card.update(task=spec.task, regression=spec.regression, labels=spec.labels, n_choices=spec.n_choices)
    return card


async def _read_body(http: Request, limit: int) -> bytes:
    too_large = APIError(
        413, f"the request body is larger than this server's limit of {limit} bytes", code="request_too_large"
    )
    declared = http.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in http.stream():  # a chunked body has no length to check first
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_body(http: Request, limit: int) -> Any:
    """The request's JSON body (at most ``limit`` bytes)."""
    try:
        raw = await _read_body(http, limit)
    except ClientDisconnect:
        raise APIError(400, "the client went away before sending its whole request") from None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise bad_request(
            f"We could not parse the JSON body of your request ({type(e).__name__}: {str(e)[:200]}). "
            "The OpenAI API expects a JSON payload"
        ) from None


async def authorized_request(server: ServerState, http: Request, endpoint: str) -> tuple[Any, ServedModel]:
    """A model endpoint's first steps: the API key checked, the JSON body read within the server's
    limit, and the model it names, which must answer ``endpoint``."""
    check_api_key(http, server.api_key)
    body = await read_json_body(http, server.limits.max_body_bytes)
    return body, served_model(server, body, endpoint)


def served_model(server: ServerState, body: Any, endpoint: str) -> ServedModel:
    """The model a request names: 404 when none has that name, 400 when it does not answer ``endpoint``."""
    name = requested_model(body)
    model = server.models.get(name)
    if model is None:
        raise model_not_found(name)
    if endpoint not in model.endpoints:
        raise APIError(
            400,
            f"The model `{name}` is {model.describe()}: it answers {' and '.join(model.endpoints)}, "
            f"not {endpoint}",
            param="model",
            code="model_not_supported",
        )
    return model


def _encode_prompts(engine: Engine, request: CompletionRequest) -> list[tuple[list[int], str]]:
    """(token ids, text) of each prompt; each must leave room for max_tokens in the context."""
    tokenizer, model = engine.tokenizer, engine.model
    prompts = []
    for prompt in request.prompts:
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt) if prompt else start_ids(model, tokenizer)
            text = prompt
        else:
            ids, text = prompt, tokenizer.decode_text(prompt)
        check_context(ids, request.params.max_tokens, model.config.context_length)
        prompts.append((ids, text))
    return prompts


async def complete(server: ServerState, http: Request) -> Response:
    """``POST /v1/completions``: check, queue, then answer whole or as a stream."""
    body, served = await authorized_request(server, http, COMPLETIONS)
    engine = served.engine
    request = parse_completion_request(body, server.limits, engine.model.config.total_vocab_size)
    logprobs = LogprobsWriter(engine.tokenizer)
    prompts = _encode_prompts(engine, request)
    completion = Completion(http, request, prompts, server.limits.request_timeout, engine.clock)
    submit(engine, completion)
    if request.stream:
        return StreamingResponse(
            _sse(completion, engine, served.name, logprobs),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    if not await finished(completion, engine):  # the client left: nobody reads this
        return Response(status_code=499)
    writer = logprobs if request.params.logprobs is not None else None
    return JSONResponse(
        completion_body(
            completion.id,
            completion.created,
            served.name,
            completion.choices,
            completion.prompt_tokens,
            writer,
        )
    )


async def finished(completion: Completion, engine: Engine) -> bool:
    """Wait for a request that does not stream: True when every choice is done, False when the
    client left first; an engine error becomes its HTTP error."""
    async for _ in completion.stream_events(engine):
        pass
    for choice in completion.choices:
        if choice.error is not None:
            raise engine_error(choice.error)
    return all(choice.done for choice in completion.choices)


def submit(engine: Engine, completion: Completion) -> None:
    """Queue a request's sequences: 429 when the queue has no room, 503 when shutting down."""
    try:
        engine.submit(completion.sequences)
    except QueueFull as e:
        raise APIError(429, str(e), type="rate_limit_exceeded", code="queue_full") from None
    except EngineStopped as e:
        raise APIError(503, str(e), type="server_error", code="shutting_down") from None


async def classify(server: ServerState, http: Request) -> Response:
    """``POST /v1/classify``: the task's inputs → labels and probabilities, batched with other requests."""
    body, served = await authorized_request(server, http, CLASSIFY)
    task = served.task
    request = parse_classify_request(body, server.limits, task.spec.task)
    try:
        examples = task.encode(request.rows)  # the task's own checks and input transformation
    except DataError as e:
        raise bad_request(f"'input' {e}", "input") from None
    try:
        records = await _pool(served.batchers[CLASSIFY], examples, server.limits, http)
    except _ClientLeft:
        return Response(status_code=499)  # nobody reads this
    prompt_tokens = sum(len(sequence) for example in examples for sequence in example.sequences)
    return JSONResponse(
        classification_body(
            f"classify-{uuid.uuid4().hex}", int(time.time()), served.name, records, prompt_tokens
        )
    )


async def embed(server: ServerState, http: Request) -> Response:
    """``POST /v1/embeddings``: each input's h_n at its last token (see :mod:`gptkit.serve.models`)."""
    body, served = await authorized_request(server, http, EMBEDDINGS)
    config = served.gpt.config
    request = parse_embedding_request(body, server.limits, config.total_vocab_size, config.d_model)
    sequences = []
    for index, item in enumerate(request.inputs):
        ids = served.tokenizer.encode(item) if isinstance(item, str) else item
        if not ids:
            raise bad_request(f"'input' item {index} holds no tokens", "input")
        if len(ids) > served.max_input_tokens:
            raise bad_request(
                f"This model's maximum input length is {served.max_input_tokens} tokens, however input "
                f"{index} has {len(ids)} tokens. Please reduce the length of the input.",
                "input",
                "context_length_exceeded",
            )
        sequences.append(served.embedding_input(ids))
    try:
        vectors = await _pool(served.batchers[EMBEDDINGS], sequences, server.limits, http)
    except _ClientLeft:
        return Response(status_code=499)  # nobody reads this
    prompt_tokens = sum(len(sequence) for sequence in sequences)
    return JSONResponse(embeddings_body(served.name, vectors, prompt_tokens, request.base64))


class _ClientLeft(Exception):
    """The client of a waiting classify or embeddings request disconnected."""


async def _pool(batcher: Batcher, items: list, limits: ServeLimits, http: Request) -> list:
    """Run ``items`` in the batcher's next batches; its failures as HTTP errors. A request whose
    client disconnects while it waits is withdrawn (the batcher skips its inputs not yet run), as
    a completion's decoding is stopped: raises :class:`_ClientLeft`."""
    submitted = asyncio.ensure_future(batcher.submit(items, limits.request_timeout))
    try:
        while not submitted.done():
            await asyncio.wait({submitted}, timeout=_POLL_SECONDS)
            if not submitted.done() and await http.is_disconnected():
                raise _ClientLeft
        return submitted.result()
    except QueueFull as e:
        raise APIError(429, str(e), type="rate_limit_exceeded", code="queue_full") from None
    except EngineStopped as e:
        raise APIError(503, str(e), type="server_error", code="shutting_down") from None
    except TimeoutError:
        raise engine_error("timeout") from None
    except BatchFailed:
        raise APIError(500, "the model failed while running this request", type="server_error") from None
    finally:
        submitted.cancel()  # a no-op once done; else its inputs leave the queue


def model_not_found(model: str) -> APIError:
    return APIError(
        404,
        f"The model `{model[:200]}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def sse_data(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


async def _sse(
    completion: Completion, engine: Engine, model: str, writer: LogprobsWriter
) -> AsyncIterator[str]:
    """The server-sent events of a streamed completion, ending in ``data: [DONE]``."""
    request = completion.request
    with_logprobs = request.params.logprobs is not None
    header = (completion.id, completion.created, model)
    offsets = []  # where the next token of each choice starts in prompt + completion
    for choice in completion.choices:
        offsets.append(0 if choice.echo else len(choice.prompt_text))
        if choice.echo and not with_logprobs:
            yield sse_data(chunk_body(*header, choice.index, choice.prompt_text))
    async for events in completion.stream_events(engine):
        # One write for what came at once (a step's tokens of every choice).
        data = "".join(_event_data(completion, header, writer, offsets, with_logprobs, e) for e in events)
        if data:
            yield data
    if not all(choice.done for choice in completion.choices):
        return  # the client went away
    if request.include_usage:
        completion_tokens = sum(c.completion_tokens for c in completion.choices)
        last = chunk_body(*header, 0, "")
        last.update(choices=[], usage=usage(completion.prompt_tokens, completion_tokens))
        yield sse_data(last)
    yield sse_data("[DONE]")


def _event_data(
    completion: Completion,
    header: tuple,
    writer: LogprobsWriter,
    offsets: list[int],
    with_logprobs: bool,
    event: Event,
) -> str:
    """The server-sent event of one engine event ("" for none); ``offsets`` move on."""
    choice = completion.choices[event.index]
    if event.error is not None:
        return sse_data(engine_error(event.error).body())
    if event.prompt_logprobs is not None:  # echo with logprobs: the prompt and its scores first
        entries = list(zip(choice.prompt_ids, event.prompt_logprobs))
        pieces = writer.prompt_pieces(choice)
        logprobs, offsets[event.index] = writer.write(entries, offsets[event.index], pieces)
        return sse_data(chunk_body(*header, choice.index, choice.prompt_text, logprobs))
    logprobs = None
    if with_logprobs and event.token_id is not None and event.logprob is not None:
        # The chunk's text is its token's: what the stream sends with it.
        logprobs, offsets[event.index] = writer.write(
            [(event.token_id, event.logprob)], offsets[event.index], [event.text]
        )
    if event.text or logprobs is not None or event.finish_reason is not None:
        return sse_data(chunk_body(*header, choice.index, event.text, logprobs, event.finish_reason))
    return ""


class Completion:
    """The sequences of one ``/v1/completions`` request, and the events the engine sends them."""

    def __init__(
        self,
        http: Request,
        request: CompletionRequest,
        prompts: list[tuple[list[int], str]],
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``timeout`` seconds on ``clock``: the engine's, which reads the deadline."""
        self.http = http
        self.request = request
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.clock = clock
        self.deadline = clock() + timeout
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()  # the engine hands each step's events to it at once

        self.prompt_tokens = sum(len(ids) for ids, _ in prompts)
        self.choices: list[Choice] = []
        self.sequences: list[GenerationRequest] = []
        n, params = request.n, request.params
        for p, (ids, text) in enumerate(prompts):
            for j in range(n):
                index = p * n + j
                # Choice i of a seeded request samples with seed + i: reproducible, and not n copies.
                seed = None if params.seed is None else (params.seed + index) % 2**64
                choice_params = dataclasses.replace(params, seed=seed)
                self.choices.append(Choice(index, ids, text, request.echo))
                self.sequences.append(
                    GenerationRequest(index, ids, choice_params, self.events.put_nowait, self.deadline, loop)
                )

    async def stream_events(self, engine: Engine) -> AsyncIterator[list[Event]]:
        """The engine's events, as many as have come at once, until every choice is done; stops (and
        cancels) if the client leaves."""
        pending = len(self.sequences)
        try:
            while pending:
                try:
                    events = [await asyncio.wait_for(self.events.get(), _POLL_SECONDS)]
                except TimeoutError:
                    if await self.http.is_disconnected():
                        return
                    if self.clock() > self.deadline + 10 or not engine.alive:  # the engine is stuck
                        stuck = [Event(c.index, error="internal") for c in self.choices if not c.done]
                        for event in stuck:
                            self.choices[event.index].add(event)
                        yield stuck
                        return
                    continue
                while not self.events.empty():
                    events.append(self.events.get_nowait())
                for event in events:
                    choice = self.choices[event.index]
                    was_done = choice.done
                    choice.add(event)
                    pending -= choice.done and not was_done
                yield events
        finally:
            unfinished = [s for s, c in zip(self.sequences, self.choices) if not c.done]
            for sequence in unfinished:
                sequence.cancel()
            if unfinished:
                engine.wake()
