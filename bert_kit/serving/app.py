"""The HTTP API: a Starlette app around the operations of one model folder and a `Batcher`.

    POST /embed, /classify, /tag, /answer, /similarity, /fill-mask   {"inputs": [...], options}
    POST /rerank        {"query": ..., "documents": [...], "top_n": n}  (a reranker folder)
    GET  /health        200 {"status": "ok"} while the batching thread runs
    GET  /info          the model, its task, labels and the server's limits
    GET  /metrics       Prometheus text format
    GET  /openapi.json  OpenAPI 3.1 description of all of the above

A request is refused before it costs model time: 400 when the body is not JSON (or nests too
deeply, or holds a number past Python's 4,300 digits), 408 when the body does not arrive within
`read_timeout` seconds, 413 past a size limit (body bytes, inputs per request, characters per
input, an operation's own: masks per request), 422 when a field has the wrong type or content
(the message names the field, e.g. "inputs[2].context"; a lone surrogate such as "\ud800" is no
text), 503 with Retry-After when `max_queue` requests are already being tokenized or computed.
Errors are JSON: {"error": message, "field": name}; a client's mistake is never a 500.

The event loop only reads bodies and writes answers: parsing, checking and tokenizing run on one
`Preparer` thread (the texts of requests that wait together in one tokenizer call), the model on
the batcher's, so /health answers while both work. A POST to an operation skips Starlette's
router and middleware (`DirectPosts`). A model output that is not finite (NaN or inf) is a 500
saying so, never invalid JSON.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from bert_kit.serving import jsonio
from bert_kit.serving.batcher import Batcher, BatcherStopped, QueueFull
from bert_kit.serving.metrics import CONTENT_TYPE, ServerMetrics
from bert_kit.serving.operations import NonFiniteOutput, Operation
from bert_kit.serving.schema import InputError, check, check_text

log = logging.getLogger("bert_kit.serve")


@dataclass
class Limits:
    """What one request may ask for; past these the server answers 413 (408 past read_timeout)."""

    max_inputs: int = 64  # inputs per request
    max_chars: int = 20_000  # characters per text (each question and context count apart)
    retry_after: int = 1  # seconds a 503 asks the client to wait
    read_timeout: float = 30.0  # seconds a client may take to send a request's body
    max_queue: int = 256  # requests being tokenized or computed at once; past it 503

    @property
    def max_body_bytes(self) -> int:
        # room for every input at the limit, even with JSON escapes (up to 6 bytes a character)
        return self.max_inputs * self.max_chars * 6 + 65_536


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate written as \ud800


def json_response(content: Any, status: int = 200, headers: dict | None = None) -> Response:
    """Always valid JSON (`jsonio`: orjson or the standard library): a NaN or inf in `content` is
    NonFiniteOutput, never a `NaN` token."""
    try:
        body = jsonio.dumps(content)
    except jsonio.NotFinite:
        raise NonFiniteOutput("the model produced non-finite values (NaN or inf) in its output") from None
    return Response(body, status, headers, media_type="application/json")


def error(status: int, message: str, field: str | None = None, headers: dict | None = None) -> Response:
    body: dict[str, Any] = {"error": _printable(message)}
    if field is not None:
        body["field"] = _printable(field)
    return json_response(body, status, headers)


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body's bytes; InputError 413 past `limit` bytes (read no further), 408 when it has not
    all arrived after `timeout` seconds (a stalled or trickling client holds a connection)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InputError("body", f"has {declared} bytes; the limit is {limit}", 413)

    async def chunks() -> bytes:
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise InputError("body", f"is over the limit of {limit} bytes", 413)
            parts.append(chunk)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(chunks(), timeout)
    except asyncio.TimeoutError:
        raise InputError("body", f"did not arrive within {timeout:g} s (the server's read timeout)", 408) from None


def parse_json(raw: bytes) -> Any:
    """The parsed body; InputError 400 when it is not standard JSON or cannot be held."""
    try:
        return jsonio.loads(raw)
    except RecursionError:
        raise InputError("body", "is nested too deeply", 400) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, NaN, an integer past 4,300 digits
        reason = "holds an integer of more than 4300 digits" if "integer string conversion" in str(e) else \
            f"is not valid JSON: {e}"
        raise InputError("body", reason, 400) from None


def validate(op: Operation, body: Any, limits: Limits) -> tuple[list, dict]:
    """(inputs, options) of a parsed body; InputError (413 or 422) naming the field at fault. The
    inputs are the list `op.inputs_field` names ("inputs"; /rerank's "documents")."""
    field = op.inputs_field
    if isinstance(body, dict) and isinstance(body.get(field), list) and len(body[field]) > limits.max_inputs:
        raise InputError(field, f"has {len(body[field])} items; at most {limits.max_inputs} per request", 413)
    check(body, op.request_schema())
    check_text(body)
    for i, value in enumerate(body[field]):
        for text in op.strings(value):
            if len(text) > limits.max_chars:
                raise InputError(f"{field}[{i}]", f"has {len(text)} characters; at most {limits.max_chars}", 413)
    for name in op.options:  # a text option (/rerank's query) counts as an input does
        if isinstance(body.get(name), str) and len(body[name]) > limits.max_chars:
            raise InputError(name, f"has {len(body[name])} characters; at most {limits.max_chars}", 413)
    return body[field], op.with_defaults(body)


class Preparer:
    """One daemon thread that parses, checks and tokenizes requests off the event loop, in arrival
    order. Requests that wait together are prepared together (`prepare_many`): under load one
    tokenizer call serves all their texts instead of one call each. (Daemon: a stuck call can
    never keep the process from exiting.)

    prepare_many: requests -> one result or exception per request, in order."""

    BATCH = 32  # most requests prepared at once: a big batch would hold up the first of them

    def __init__(self, prepare_many: Callable[[list], list]) -> None:
        self._prepare_many = prepare_many
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="prepare", daemon=True)
        self._thread.start()

    async def run(self, request: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((request, loop, future))
        return await future

    def _work(self) -> None:
        while True:
            calls = [self._calls.get()]
            while len(calls) < self.BATCH:
                try:
                    calls.append(self._calls.get_nowait())
                except queue.Empty:
                    break
            try:
                results = self._prepare_many([request for request, _, _ in calls])
            except BaseException as e:  # handed to the requests: nothing kills this thread
                results = [e] * len(calls)
            for (_, loop, future), result in zip(calls, results):
                def resolve(future: asyncio.Future = future, result: Any = result) -> None:
                    if not future.done():  # cancelled: the grace period ran out
                        if isinstance(result, BaseException):
                            future.set_exception(result)
                        else:
                            future.set_result(result)

                try:
                    loop.call_soon_threadsafe(resolve)
                except RuntimeError:  # the event loop has closed
                    pass


class Server:
    """Request handling shared by the routes: counts, limits, batching and errors."""

    def __init__(self, info: dict, operations: Sequence[Operation], batcher: Batcher, limits: Limits,
                 metrics: ServerMetrics):
        self.info, self.operations, self.batcher, self.limits = info, list(operations), batcher, limits
        self.metrics = metrics
        self.accepted = self.answered = 0  # requests that reached an operation, and their responses
        self.pending = 0  # requests being prepared or computed: at most limits.max_queue
        self.preparer = Preparer(self._prepare_many)

    async def handle(self, request: Request, op: Operation) -> Response:
        start = time.perf_counter()
        self.accepted += 1
        try:
            response = await self._compute(request, op)
        except asyncio.CancelledError:  # uvicorn cancels what the grace period after SIGTERM did not finish
            self.metrics.requests.inc(op.path, "503")
            return error(503, "the server stopped before this request was answered (its grace period ran out)")
        self.answered += 1
        self.metrics.requests.inc(op.path, str(response.status_code))
        self.metrics.latency.observe(time.perf_counter() - start, op.path)
        return response

    def _prepare_many(self, requests: list[tuple[Operation, bytes]]) -> list:
        """(items, options), or the exception to raise, of each (operation, body): parsed, checked
        and tokenized on the Preparer's thread, the texts of one operation's requests together."""
        results: list = [None] * len(requests)
        checked: dict[Operation, list[tuple[int, list, dict]]] = {}
        for k, (op, raw) in enumerate(requests):
            try:
                inputs, options = validate(op, parse_json(raw), self.limits)
                checked.setdefault(op, []).append((k, inputs, options))
            except Exception as e:
                results[k] = e
        for op, group in checked.items():
            prepared = op.prepare_many([(inputs, options) for _, inputs, options in group])
            for (k, _, options), items in zip(group, prepared):
                results[k] = items if isinstance(items, BaseException) else (items, options)
        return results

    async def _compute(self, request: Request, op: Operation) -> Response:
        try:
            raw = await read_body(request, self.limits.max_body_bytes, self.limits.read_timeout)
            if self.pending >= self.limits.max_queue:
                raise QueueFull(f"{self.pending} requests are in progress (the bound is {self.limits.max_queue})")
            self.pending += 1
            self.metrics.pending.set(self.pending)
            try:
                items, options = await self.preparer.run((op, raw))
                outputs = await self.batcher.submit(op, items)
            finally:
                self.pending -= 1
                self.metrics.pending.set(self.pending)
            return json_response({op.output_key: op.respond(outputs, options)})
        except InputError as e:
            return error(e.status, str(e), e.field)
        except ClientDisconnect:  # gone before its body arrived: nobody reads this answer
            self.metrics.disconnects.inc()
            return error(400, "client disconnected while sending the body")
        except QueueFull as e:
            return error(503, f"server busy: {e}; retry later", headers={"Retry-After": str(self.limits.retry_after)})
        except BatcherStopped as e:
            return error(503, f"{e}; the server cannot answer: restart it")
        except NonFiniteOutput as e:  # the weights (or the precision) are broken, not the request
            log.error("%s: %s", op, e)
            return error(500, f"{e}; the model cannot be served as it is")
        except Exception as e:  # a bug or a model failure: answer, log, keep serving
            log.exception("%s failed", op)
            return error(500, f"internal error: {type(e).__name__}: {e}")

    # ---- GET endpoints ------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if not self.batcher.alive:
            why = self.batcher.stopped
            return error(503, "the batching thread has stopped" + (f": {type(why).__name__}: {why}" if why else ""))
        return json_response({"status": "ok"})

    async def describe(self, request: Request) -> Response:
        limits = {"max_inputs_per_request": self.limits.max_inputs, "max_chars_per_input": self.limits.max_chars,
                  "max_batch_tokens": self.batcher.max_batch_tokens, "max_wait_ms": self.batcher.max_wait * 1000,
                  "max_queue": self.limits.max_queue, "read_timeout_s": self.limits.read_timeout}
        for op in self.operations:  # its own limits (413), and its options' largest values (422 past them)
            limits.update(op.limits)
            limits.update({f"max_{name}": o["maximum"] for name, o in op.options.items() if "maximum" in o})
        return json_response({**self.info, "endpoints": [op.path for op in self.operations], "limits": limits})

    async def prometheus(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def openapi(self, request: Request) -> Response:
        return json_response(openapi_description(self.info, self.operations, self.limits))

    async def http_error(self, request: Request, exc: Exception) -> Response:
        """404 and 405 as JSON, like every other error (405 keeps its Allow header); a 404 names the
        endpoints this model has (POST /rerank to an embedding model's server: it has /embed)."""
        assert isinstance(exc, HTTPException)
        known = {op.path for op in self.operations}
        self.metrics.requests.inc(request.url.path if request.url.path in known else "other", str(exc.status_code))
        served = f" (this server's model answers POST {', '.join(sorted(known))})" if exc.status_code == 404 else ""
        return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}{served}", headers=exc.headers)


def openapi_description(info: dict, operations: Sequence[Operation], limits: Limits) -> dict:
    """OpenAPI 3.1 for this server; request bodies are the schemas `validate` checks."""
    def reply(description: str) -> dict:
        return {"description": description, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Error"}}}}

    errors = {"400": reply("the body is not JSON (or nests too deeply, or holds an integer past 4300 digits)"),
              "408": reply(f"the body did not arrive within {limits.read_timeout:g} s"),
              "422": reply("a field has the wrong type or content (a lone surrogate is no text); `field` names it"),
              "500": reply("the model failed, e.g. produced non-finite values (NaN or inf)"),
              "503": {**reply("the queue is full (retry after the Retry-After header's seconds), or the batching "
                              "thread has stopped"), "headers": {"Retry-After": {"schema": {"type": "integer"}}}}}
    paths: dict[str, Any] = {}
    for op in operations:
        body = op.request_schema()
        body["properties"][op.inputs_field]["maxItems"] = limits.max_inputs
        over = [f"{limits.max_inputs} inputs per request", f"{limits.max_chars} characters per text"]
        over += [f"{value} {name.removeprefix('max_').replace('_', ' ')}" for name, value in op.limits.items()]
        out = {"type": "object", "properties": {op.output_key: {"type": "array", "items": op.output_schema}}}
        paths[op.path] = {"post": {
            "summary": op.summary, "operationId": op.path.strip("/").replace("-", "_"),
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": body, "example": op.example_body()}}},
            "responses": {"200": {"description": "one output per input, in order",
                                  "content": {"application/json": {"schema": out}}},
                          "413": reply("over a limit: " + ", ".join(over)), **errors}}}
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
               metrics: ServerMetrics | None = None) -> "DirectPosts":
    """The ASGI app (`app.state.server` its `Server`). The batcher thread starts with the app and
    stops after the last request."""
    server = Server(info, operations, batcher, limits or Limits(), metrics or batcher.metrics)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        batcher.start()
        yield
        # uvicorn calls this after the last connection closed: the queue is empty unless the grace
        # period ran out, and then nobody waits for a batch still running (a daemon thread)
        await asyncio.to_thread(batcher.close, 1.0)

    def route(op: Operation) -> Route:
        async def endpoint(request: Request) -> Response:
            return await server.handle(request, op)
        return Route(op.path, endpoint, methods=["POST"])

    routes = [route(op) for op in operations] + [
        Route("/health", server.health, methods=["GET"]), Route("/info", server.describe, methods=["GET"]),
        Route("/metrics", server.prometheus, methods=["GET"]), Route("/openapi.json", server.openapi, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: server.http_error})
    app.state.server = server
    return DirectPosts(app, server)  # type: ignore[return-value]


class DirectPosts:
    """ASGI: a POST to an operation's path goes straight to `Server.handle`; everything else (the GET
    endpoints, 404 and 405, the lifespan) to the Starlette app. Its middleware layers and router cost
    about 12% of a worker's CPU under load, for requests that `handle` answers whatever happens."""

    def __init__(self, app: Starlette, server: Server):
        self.app, self.state = app, app.state
        self._server = server
        self._posts = {op.path: op for op in server.operations}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            send = self._delivering(send)
        op = self._posts.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if op is None:
            await self.app(scope, receive, send)
            return
        response = await self._server.handle(Request(scope, receive), op)
        await response(scope, receive, send)

    def _delivering(self, send: Callable) -> Callable:
        """`send` for one request, dropping its answer once the client has closed the connection.
        A client that closes with pipelined requests in flight: uvicorn (with uvloop) writes their
        answers to the closed transport and raises, which logged "Exception in ASGI application"
        and a traceback per request. The answer goes nowhere, quietly; the metric
        bert_kit_client_disconnects_total counts it."""
        gone = False

        async def send_or_drop(message: dict) -> None:
            nonlocal gone
            if gone:
                return
            try:
                await send(message)
            except (OSError, RuntimeError) as e:
                if isinstance(e, RuntimeError) and "closed" not in str(e):
                    raise  # not the transport: a bug to report
                gone = True
                self._server.metrics.disconnects.inc()
                log.debug("client gone before its answer: %s", e)
                # uvicorn marks only the newest request of a closed connection as disconnected; marked,
                # this one is not reported as "returned without completing response" either
                cycle = getattr(send, "__self__", None)
                if hasattr(cycle, "disconnected"):
                    cycle.disconnected = True

        return send_or_drop
