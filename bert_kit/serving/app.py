"""The HTTP API: a Starlette app around the operations of one model folder and a `Batcher`.

    POST /embed, /classify, /tag, /answer, /similarity, /fill-mask   {"inputs": [...], options}
    GET  /health        200 {"status": "ok"} while the batching thread runs
    GET  /info          the model, its task, labels and the server's limits
    GET  /metrics       Prometheus text format
    GET  /openapi.json  OpenAPI 3.1 description of all of the above

A request is refused before it costs model time: 400 when the body is not JSON, 413 past a size
limit (body bytes, inputs per request, characters per input), 422 when a field has the wrong type
or content (the message names the field, e.g. "inputs[2].context"), 503 with Retry-After when the
batcher already holds `max_queue` requests. Errors are JSON: {"error": message, "field": name}.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from bert_kit.serving.batcher import Batcher, QueueFull
from bert_kit.serving.metrics import CONTENT_TYPE, ServerMetrics
from bert_kit.serving.operations import Operation
from bert_kit.serving.schema import InputError, check

log = logging.getLogger("bert_kit.serve")
INLINE_CHARS = 20_000  # smaller requests are tokenized on the event loop; larger ones in a thread


@dataclass
class Limits:
    """What one request may ask for; past these the server answers 413."""

    max_inputs: int = 64  # inputs per request
    max_chars: int = 20_000  # characters per text (each question and context count apart)
    retry_after: int = 1  # seconds a 503 asks the client to wait

    @property
    def max_body_bytes(self) -> int:
        # room for every input at the limit, even with JSON escapes (up to 6 bytes a character)
        return self.max_inputs * self.max_chars * 6 + 65_536


def error(status: int, message: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers)


async def read_json(request: Request, limit: int) -> Any:
    """The parsed body; InputError 413 past `limit` bytes (read no further), 400 when not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InputError("body", f"has {declared} bytes; the limit is {limit}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InputError("body", f"is over the limit of {limit} bytes", 413)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError("body", f"is not valid JSON: {e}", 400) from None


def validate(op: Operation, body: Any, limits: Limits) -> tuple[list, dict]:
    """(inputs, options) of a parsed body; InputError (413 or 422) naming the field at fault."""
    if isinstance(body, dict) and isinstance(body.get("inputs"), list) and len(body["inputs"]) > limits.max_inputs:
        raise InputError("inputs", f"has {len(body['inputs'])} items; at most {limits.max_inputs} per request", 413)
    check(body, op.request_schema())
    for i, value in enumerate(body["inputs"]):
        for text in op.strings(value):
            if len(text) > limits.max_chars:
                raise InputError(f"inputs[{i}]", f"has {len(text)} characters; at most {limits.max_chars}", 413)
    return body["inputs"], op.with_defaults(body)


class Server:
    """Request handling shared by the routes: counts, limits, batching and errors."""

    def __init__(self, info: dict, operations: Sequence[Operation], batcher: Batcher, limits: Limits,
                 metrics: ServerMetrics):
        self.info, self.operations, self.batcher, self.limits = info, list(operations), batcher, limits
        self.metrics = metrics
        self.accepted = self.answered = 0  # requests that reached an operation, and their responses

    async def handle(self, request: Request, op: Operation) -> Response:
        start = time.perf_counter()
        self.accepted += 1
        response = await self._compute(request, op)  # cancelled (grace period over): not answered
        self.answered += 1
        self.metrics.requests.inc(op.path, str(response.status_code))
        self.metrics.latency.observe(time.perf_counter() - start, op.path)
        return response

    async def _compute(self, request: Request, op: Operation) -> Response:
        try:
            inputs, options = validate(op, await read_json(request, self.limits.max_body_bytes), self.limits)
            if sum(len(s) for x in inputs for s in op.strings(x)) <= INLINE_CHARS:
                items = op.prepare(inputs, options)
            else:  # long texts: tokenize off the event loop (the Rust tokenizer releases the GIL)
                items = await run_in_threadpool(op.prepare, inputs, options)
            outputs = await self.batcher.submit(op, items)
            return JSONResponse({op.output_key: op.respond(outputs, options)})
        except InputError as e:
            return error(e.status, str(e), e.field)
        except ClientDisconnect:  # gone before its body arrived: nobody reads this answer
            return error(400, "client disconnected while sending the body")
        except QueueFull as e:
            return error(503, f"server busy: {e}; retry later", headers={"Retry-After": str(self.limits.retry_after)})
        except Exception as e:  # a bug or a model failure: answer, log, keep serving
            log.exception("%s failed", op)
            return error(500, f"internal error: {type(e).__name__}: {e}")

    # ---- GET endpoints ------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if not self.batcher.alive:
            return error(503, "the batching thread has stopped")
        return JSONResponse({"status": "ok"})

    async def describe(self, request: Request) -> Response:
        limits = {"max_inputs_per_request": self.limits.max_inputs, "max_chars_per_input": self.limits.max_chars,
                  "max_batch_tokens": self.batcher.max_batch_tokens, "max_wait_ms": self.batcher.max_wait * 1000,
                  "max_queue": self.batcher.max_queue}
        return JSONResponse({**self.info, "endpoints": [op.path for op in self.operations], "limits": limits})

    async def prometheus(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_description(self.info, self.operations, self.limits))

    async def http_error(self, request: Request, exc: Exception) -> Response:
        """404 and 405 as JSON, like every other error (405 keeps its Allow header)."""
        assert isinstance(exc, HTTPException)
        known = {op.path for op in self.operations}
        self.metrics.requests.inc(request.url.path if request.url.path in known else "other", str(exc.status_code))
        return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", headers=exc.headers)


def openapi_description(info: dict, operations: Sequence[Operation], limits: Limits) -> dict:
    """OpenAPI 3.1 for this server; request bodies are the schemas `validate` checks."""
    def reply(description: str) -> dict:
        return {"description": description, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Error"}}}}

    errors = {"400": reply("the body is not JSON"),
              "413": reply(f"over a limit: {limits.max_inputs} inputs per request, {limits.max_chars} characters "
                           "per text"),
              "422": reply("a field has the wrong type or content; `field` names it"),
              "503": {**reply("the queue is full; retry after the Retry-After header's seconds"),
                      "headers": {"Retry-After": {"schema": {"type": "integer"}}}}}
    paths: dict[str, Any] = {}
    for op in operations:
        body = op.request_schema()
        body["properties"]["inputs"]["maxItems"] = limits.max_inputs
        out = {"type": "object", "properties": {op.output_key: {"type": "array", "items": op.output_schema}}}
        paths[op.path] = {"post": {
            "summary": op.summary, "operationId": op.path.strip("/").replace("-", "_"),
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": body, "example": {"inputs": [op.example]}}}},
            "responses": {"200": {"description": "one output per input, in order",
                                  "content": {"application/json": {"schema": out}}}, **errors}}}
    for path, summary, kind in (("/health", "200 while the server can answer", "application/json"),
                                ("/info", "model, task, labels and limits", "application/json"),
                                ("/metrics", "Prometheus text format", "text/plain"),
                                ("/openapi.json", "this description", "application/json")):
        paths[path] = {"get": {"summary": summary, "responses": {"200": {"description": summary,
                                                                          "content": {kind: {}}}}}}
    return {"openapi": "3.1.0",
            "info": {"title": "bert-kit serve", "version": "1",
                     "description": f"{info.get('task') or 'encoder'} model {info.get('model')}"},
            "paths": paths,
            "components": {"schemas": {"Error": {"type": "object", "required": ["error"], "properties": {
                "error": {"type": "string"}, "field": {"type": "string"}}}}}}


def create_app(info: dict, operations: Sequence[Operation], batcher: Batcher, limits: Limits | None = None,
               metrics: ServerMetrics | None = None) -> Starlette:
    """The ASGI app. The batcher thread starts with the app and stops after the last request."""
    server = Server(info, operations, batcher, limits or Limits(), metrics or batcher.metrics)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        batcher.start()
        yield
        # uvicorn calls this after the last connection closed: the queue is empty unless requests were cancelled
        await asyncio.to_thread(batcher.close, 5.0)

    def route(op: Operation) -> Route:
        async def endpoint(request: Request) -> Response:
            return await server.handle(request, op)
        return Route(op.path, endpoint, methods=["POST"])

    routes = [route(op) for op in operations] + [
        Route("/health", server.health, methods=["GET"]), Route("/info", server.describe, methods=["GET"]),
        Route("/metrics", server.prometheus, methods=["GET"]), Route("/openapi.json", server.openapi, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: server.http_error})
    app.state.server = server
    return app
