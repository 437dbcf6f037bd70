"""The HTTP side: FastAPI routes that check requests, hand sequences to the engine and answer.

Routes: ``POST /v1/completions``, ``GET /v1/models``, ``GET /v1/models/{model}`` (these three need the
API key when one is set), ``GET /health`` and ``GET /metrics``. Every error is OpenAI's error object.
``GET /`` is the playground page (files in ``static/``, served under ``/static/``); it needs no key, and
asks for one in a field when the server has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import html
import importlib.resources
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gptkit.generation import start_ids
from gptkit.serve.config import ServeLimits
from gptkit.serve.engine import Engine, EngineStopped, Event, GenerationRequest, QueueFull
from gptkit.serve.metrics import Metrics
from gptkit.serve.protocol import (
    APIError,
    CompletionRequest,
    bad_request,
    check_context,
    parse_completion_request,
)
from gptkit.serve.responses import Choice, LogprobsWriter, chunk_body, completion_body, usage

logger = logging.getLogger("gptkit.serve")

_ENDPOINTS = {"/v1/completions", "/v1/models", "/health", "/metrics"}
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


def _engine_error(kind: str) -> APIError:
    status, message, type_, code = _ENGINE_ERRORS[kind]
    return APIError(status, message, type=type_, code=code)


class _RequestMetrics:
    """ASGI middleware: count every HTTP request by endpoint and status, and time it to its last byte."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500
        started = time.perf_counter()

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            endpoint = scope["path"] if scope["path"] in _ENDPOINTS else "other"
            self.metrics.observe(endpoint, status, time.perf_counter() - started)


class _Completion:
    """The sequences of one ``/v1/completions`` request, and the events the engine sends them."""

    def __init__(
        self, http: Request, request: CompletionRequest, prompts: list[tuple[list[int], str]], timeout: float
    ):
        self.http = http
        self.request = request
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.deadline = time.monotonic() + timeout
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def deliver(event: Event) -> None:  # called from the engine's thread
            loop.call_soon_threadsafe(self.events.put_nowait, event)

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
                self.sequences.append(GenerationRequest(index, ids, choice_params, deliver, self.deadline))

    async def stream_events(self, engine: Engine) -> AsyncIterator[Event]:
        """The engine's events until every choice is done; stops (and cancels) if the client leaves."""
        pending = len(self.sequences)
        try:
            while pending:
                try:
                    event = await asyncio.wait_for(self.events.get(), _POLL_SECONDS)
                except asyncio.TimeoutError:
                    if await self.http.is_disconnected():
                        return
                    if time.monotonic() > self.deadline + 10 or not engine.alive:  # the engine is stuck
                        for choice in self.choices:
                            if not choice.done:
                                choice.add(Event(choice.index, error="internal"))
                                yield Event(choice.index, error="internal")
                        return
                    continue
                choice = self.choices[event.index]
                was_done = choice.done
                choice.add(event)
                pending -= choice.done and not was_done
                yield event
        finally:
            unfinished = [s for s, c in zip(self.sequences, self.choices) if not c.done]
            for sequence in unfinished:
                sequence.cancel()
            if unfinished:
                engine.wake()


@dataclasses.dataclass(frozen=True)
class _Server:
    """What the routes share."""

    engine: Engine
    model_name: str
    limits: ServeLimits
    api_key: str | None
    logprobs: LogprobsWriter
    created: int  # when the server started, the model's "created"


def create_app(
    engine: Engine,
    *,
    model_name: str,
    limits: ServeLimits,
    api_key: str | None = None,
    cors_origins: tuple[str, ...] = (),
) -> FastAPI:
    """The server's ASGI app; it starts ``engine`` at startup and stops it at shutdown."""
    server = _Server(engine, model_name, limits, api_key, LogprobsWriter(engine.tokenizer), int(time.time()))
    metrics = Metrics(engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if not engine.alive:
            engine.start()
        yield
        engine.stop()

    app = FastAPI(title="gptkit", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(_RequestMetrics, metrics=metrics)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok" if engine.alive else "starting", "model": model_name}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(http: Request) -> dict:
        _check_api_key(http, api_key)
        return {"object": "list", "data": [_model_card(server)]}

    @app.get("/v1/models/{model}")
    async def model(http: Request, model: str) -> dict:
        _check_api_key(http, api_key)
        if model != model_name:
            raise _model_not_found(model)
        return _model_card(server)

    @app.post("/v1/completions")
    async def completions(http: Request) -> Response:
        return await _complete(server, http)

    page, assets = _playground(model_name, api_key is not None, limits.max_tokens_limit)

    @app.get("/")
    async def playground() -> HTMLResponse:
        return HTMLResponse(page, headers=_PAGE_HEADERS)

    @app.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in assets:
            raise StarletteHTTPException(404)
        content, media_type = assets[name]
        return Response(content, media_type=media_type, headers=_PAGE_HEADERS)

    return app


# The playground's files, besides index.html, and their content types.
_ASSETS = {
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_PAGE_HEADERS = {
    # Scripts, styles, images and fetches from this origin only: no inline script, nothing from elsewhere.
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'self'; form-action 'self'; frame-ancestors 'self'; object-src 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _playground(
    model_name: str, key_required: bool, max_tokens: int
) -> tuple[str, dict[str, tuple[bytes, str]]]:
    """The page, with this server's settings filled in, and its other files: read once, at startup."""
    folder = importlib.resources.files("gptkit.serve") / "static"
    page = (folder / "index.html").read_text(encoding="utf-8")
    settings = {
        "model": model_name,
        "api_key": "required" if key_required else "none",
        "max_tokens": max_tokens,
    }
    # One pass, so that a model name holding "{{...}}" is not filled in again.
    page = re.sub(r"\{\{(\w+)\}\}", lambda m: html.escape(str(settings[m[1]]), quote=True), page)
    assets = {name: ((folder / name).read_bytes(), media_type) for name, media_type in _ASSETS.items()}
    return page, assets


async def _api_error(request: Request, error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    message = "Not found" if error.status_code == 404 else str(error.detail)
    return JSONResponse(APIError(error.status_code, message).body(), status_code=error.status_code)


async def _unexpected_error(request: Request, error: Exception) -> JSONResponse:
    logger.exception("unexpected error answering %s", request.url.path)
    body = APIError(500, "the server had an error while processing your request", type="server_error")
    return JSONResponse(body.body(), status_code=500)


def _check_api_key(http: Request, api_key: str | None) -> None:
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


def _model_card(server: _Server) -> dict:
    return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "gptkit"}


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


async def _complete(server: _Server, http: Request) -> Response:
    """``POST /v1/completions``: check, queue, then answer whole or as a stream."""
    _check_api_key(http, server.api_key)
    try:
        raw = await _read_body(http, server.limits.max_body_bytes)
    except ClientDisconnect:
        return Response(status_code=400)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise bad_request(
            f"We could not parse the JSON body of your request ({type(e).__name__}: {str(e)[:200]}). "
            "The OpenAI API expects a JSON payload"
        ) from None
    engine = server.engine
    request = parse_completion_request(body, server.limits, engine.model.config.total_vocab_size)
    if request.model != server.model_name:
        raise _model_not_found(request.model)
    completion = _Completion(http, request, _encode_prompts(engine, request), server.limits.request_timeout)
    try:
        engine.submit(completion.sequences)
    except QueueFull as e:
        raise APIError(429, str(e), type="rate_limit_exceeded", code="queue_full") from None
    except EngineStopped as e:
        raise APIError(503, str(e), type="server_error", code="shutting_down") from None
    if request.stream:
        return StreamingResponse(
            _sse(completion, engine, server.model_name, server.logprobs),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    async for _ in completion.stream_events(engine):
        pass
    for choice in completion.choices:
        if choice.error is not None:
            raise _engine_error(choice.error)
    if not all(choice.done for choice in completion.choices):  # the client left: nobody reads this
        return Response(status_code=499)
    writer = server.logprobs if request.params.logprobs is not None else None
    return JSONResponse(
        completion_body(
            completion.id,
            completion.created,
            server.model_name,
            completion.choices,
            completion.prompt_tokens,
            writer,
        )
    )


def _model_not_found(model: str) -> APIError:
    return APIError(
        404,
        f"The model `{model[:200]}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def _sse_data(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


async def _sse(
    completion: _Completion, engine: Engine, model: str, writer: LogprobsWriter
) -> AsyncIterator[str]:
    """The server-sent events of a streamed completion, ending in ``data: [DONE]``."""
    request = completion.request
    with_logprobs = request.params.logprobs is not None
    header = (completion.id, completion.created, model)
    offsets = []  # where the next token of each choice starts in prompt + completion
    for choice in completion.choices:
        offsets.append(0 if choice.echo else len(choice.prompt_text))
        if choice.echo and not with_logprobs:
            yield _sse_data(chunk_body(*header, choice.index, choice.prompt_text))
    async for event in completion.stream_events(engine):
        choice = completion.choices[event.index]
        if event.error is not None:
            yield _sse_data(_engine_error(event.error).body())
            continue
        if event.prompt_logprobs is not None:  # echo with logprobs: the prompt and its scores first
            entries = list(zip(choice.prompt_ids, event.prompt_logprobs))
            logprobs, offsets[event.index] = writer.write(entries, offsets[event.index])
            yield _sse_data(chunk_body(*header, choice.index, choice.prompt_text, logprobs))
            continue
        logprobs = None
        if with_logprobs and event.token_id is not None and event.logprob is not None:
            logprobs, offsets[event.index] = writer.write(
                [(event.token_id, event.logprob)], offsets[event.index]
            )
        if event.text or logprobs is not None or event.finish_reason is not None:
            yield _sse_data(chunk_body(*header, choice.index, event.text, logprobs, event.finish_reason))
    if not all(choice.done for choice in completion.choices):
        return  # the client went away
    if request.include_usage:
        completion_tokens = sum(c.completion_tokens for c in completion.choices)
        last = chunk_body(*header, 0, "")
        last.update(choices=[], usage=usage(completion.prompt_tokens, completion_tokens))
        yield _sse_data(last)
    yield _sse_data("[DONE]")
