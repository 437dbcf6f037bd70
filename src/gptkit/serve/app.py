"""The HTTP side: the FastAPI app, its routes, middleware and error answers, and the playground page;
the endpoints' own work (reading a request, the model it names, the answer) is in ``endpoints``.

Routes: ``POST /v1/completions`` (language models), ``POST /v1/classify`` (fine-tuned models; also
at ``/classify``, as vLLM), ``POST /v1/embeddings`` (every model), ``GET /v1/models``,
``GET /v1/models/{model}`` (these need the API key when one is set), ``GET /health`` and
``GET /metrics``. Every error is OpenAI's error object.
``GET /`` is the playground page (files in ``static/``, served under ``/static/``); it needs no key, and
asks for one in a field when the server has one.
"""

from __future__ import annotations

import contextlib
import html
import importlib.resources
import logging
import re
import time
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gptkit.serve import endpoints
from gptkit.serve.chat import chat_complete
from gptkit.serve.config import ServeLimits
from gptkit.serve.metrics import Metrics
from gptkit.serve.models import CHAT_COMPLETIONS, CLASSIFY, COMPLETIONS, EMBEDDINGS, ServedModel
from gptkit.serve.openapi import openapi_document
from gptkit.serve.protocol import APIError

logger = logging.getLogger("gptkit.serve")

_ENDPOINTS = {
    COMPLETIONS,
    CHAT_COMPLETIONS,
    CLASSIFY,
    "/classify",
    EMBEDDINGS,
    "/v1/models",
    "/health",
    "/metrics",
}


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


def create_app(
    models: Sequence[ServedModel],
    *,
    limits: ServeLimits,
    api_key: str | None = None,
    cors_origins: tuple[str, ...] = (),
) -> FastAPI:
    """The server's ASGI app; it starts the models' loops at startup and stops them at shutdown."""
    if not models:
        raise ValueError("a server needs at least one model")
    server = endpoints.ServerState({model.name: model for model in models}, limits, api_key, int(time.time()))
    metrics = Metrics(models)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        for model in models:
            model.start()
        yield
        for model in models:
            await model.stop()

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

    _add_api_routes(app, server, list(models), metrics)
    _add_page_routes(app, server, list(models))
    return app


def _add_api_routes(
    app: FastAPI, server: endpoints.ServerState, models: list[ServedModel], metrics: Metrics
) -> None:
    """Health, the OpenAPI document, metrics, the model list and the three POST endpoints."""

    @app.get("/health")
    async def health() -> dict:
        alive = all(model.alive for model in models)
        return {
            "status": "ok" if alive else "starting",
            "model": models[0].name,
            "models": list(server.models),
        }

    document = openapi_document(list(models), server.limits, server.api_key is not None)

    @app.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(document)

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def list_models(http: Request) -> dict:
        endpoints.check_api_key(http, server.api_key)
        return {"object": "list", "data": [endpoints.model_card(server, model) for model in models]}

    @app.get("/v1/models/{name}")
    async def get_model(http: Request, name: str) -> dict:
        endpoints.check_api_key(http, server.api_key)
        if name not in server.models:
            raise endpoints.model_not_found(name)
        return endpoints.model_card(server, server.models[name])

    @app.post(COMPLETIONS)
    async def completions(http: Request) -> Response:
        return await endpoints.complete(server, http)

    @app.post(CHAT_COMPLETIONS)
    async def chat_completions(http: Request) -> Response:
        return await chat_complete(server, http)

    @app.post(CLASSIFY)
    @app.post("/classify")
    async def classify(http: Request) -> Response:
        return await endpoints.classify(server, http)

    @app.post(EMBEDDINGS)
    async def embeddings(http: Request) -> Response:
        return await endpoints.embed(server, http)


def _add_page_routes(app: FastAPI, server: endpoints.ServerState, models: list[ServedModel]) -> None:
    """The playground page and its files."""
    # The page generates text: it talks to the first language model (or the first model, which then
    # tells it that it does not generate).
    page_model = next((model for model in models if model.engine is not None), models[0])
    page, assets = _playground(page_model.name, server.api_key is not None, server.limits.max_tokens_limit)

    @app.get("/")
    async def playground() -> HTMLResponse:
        return HTMLResponse(page, headers=_PAGE_HEADERS)

    @app.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in assets:
            raise StarletteHTTPException(404)
        content, media_type = assets[name]
        return Response(content, media_type=media_type, headers=_PAGE_HEADERS)


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
