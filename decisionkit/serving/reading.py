"""Reading a request before the app sees it: its body within the limits (``RequestLimits``), decoded when zstd
(``decoded``) and parsed as strict JSON (``ContractRequest``, through ``ContractRoute``), and the API key
(``BearerKey``). ``app.install`` puts them on every deployment's app."""

import hmac
import json
from http import HTTPStatus
from typing import Callable

import anyio
import pydantic_core
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from .config import Limits

try:  # the SDK compresses request bodies with zstd when it can (always on Python 3.14+)
    from compression import zstd
except ImportError:
    from backports import zstd


# ----- reading requests -------------------------------------------------------------------------------------------
class ContractRequest(Request):
    """A request whose body (already read within the limits by ``RequestLimits``) is decoded when zstd-compressed,
    and parsed as strict JSON: NaN and Infinity are refused, nesting is bounded (pydantic-core's parser stops at 200
    levels)."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            received = b"".join([chunk async for chunk in self.stream()])
            self._body = decoded(received, self.headers.get("content-encoding", "identity"), self.app.state.limits)
        return self._body

    async def json(self):
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = pydantic_core.from_json(body, allow_inf_nan=False)
            except ValueError as err:  # FastAPI turns this exception into a 422 "json_invalid"
                raise json.JSONDecodeError(str(err), body.decode("utf-8", "replace"), 0) from None
        return self._json


def _too_large(size: int, limits: Limits) -> HTTPException:
    return HTTPException(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"request body is {size} bytes; the limit is {limits.max_body_bytes}")


def decoded(body: bytes, encoding: str, limits: Limits) -> bytes:
    if encoding == "identity":
        return body
    if encoding != "zstd":
        raise HTTPException(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                            f"Content-Encoding {encoding!r} is not supported; send the body as is or as zstd")
    decompressor = zstd.ZstdDecompressor()
    try:
        data = decompressor.decompress(body, max_length=limits.max_body_bytes + 1)
    except zstd.ZstdError as err:
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"the zstd body does not decode ({err})") from None
    if len(data) > limits.max_body_bytes:
        raise _too_large(len(data), limits)
    if not decompressor.eof:
        raise HTTPException(HTTPStatus.BAD_REQUEST, "the zstd body is truncated")
    return data


class ContractRoute(APIRoute):
    """FastAPI's custom route class: every route reads its request as a ContractRequest."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def contract_handler(request: Request):
            return await handler(ContractRequest(request.scope, request.receive))

        return contract_handler


class RequestLimits:
    """ASGI middleware on ``endpoint`` (``POST /v1/systemone``): a request's body is read in full before the request may wait for the model,
    so a slow upload holds a reader's place, never a model slot. While its body arrives a request holds one of
    ``max_reading`` places, and the body must come within ``read_timeout`` (408) and ``max_body_bytes`` (413); then
    it takes one of ``max_in_flight`` slots and the app reads the body as received. Past either bound, 503 with
    Retry-After instead of queueing without end (a client may retry; the SDK does by itself)."""

    def __init__(self, app, limits: Limits, endpoint: str):
        self.app, self.limits, self.endpoint, self.reading, self.active = app, limits, endpoint, 0, 0

    async def __call__(self, scope, receive, send):
        # the path the app routes on: Ray Serve mounts it under a route prefix, passed as root_path
        if scope["type"] != "http" or scope["path"].removeprefix(scope.get("root_path", "")) != self.endpoint:
            return await self.app(scope, receive, send)
        try:
            body = await self._read(Request(scope, receive))
            if self.active >= self.limits.max_in_flight:
                raise self._busy(f"{self.active} requests are in flight, the most this server takes")
        except HTTPException as refused:
            answer = JSONResponse({"detail": refused.detail}, refused.status_code, headers=refused.headers)
            return await answer(scope, receive, send)
        except ClientDisconnect:
            return  # the client left: no one to answer
        replayed = False

        async def replay():  # the body as read, then what the connection says next (a disconnect)
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        self.active += 1
        try:
            await self.app(scope, replay, send)
        finally:
            self.active -= 1

    async def _read(self, request: Request) -> bytes:
        limits = self.limits
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise _too_large(int(declared), limits)
        if self.reading >= limits.max_reading:
            raise self._busy(f"{self.reading} requests are still sending their bodies, the most this server waits for")
        self.reading += 1
        chunks, size = [], 0
        try:
            with anyio.fail_after(limits.read_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limits.max_body_bytes:
                        raise _too_large(size, limits)
                    chunks.append(chunk)
        except TimeoutError:
            raise HTTPException(HTTPStatus.REQUEST_TIMEOUT, f"the request body did not arrive within "
                                f"{limits.read_timeout:g} s ({size} of {declared or '?'} bytes came)") from None
        finally:
            self.reading -= 1
        return b"".join(chunks)

    def _busy(self, why: str) -> HTTPException:
        return HTTPException(HTTPStatus.SERVICE_UNAVAILABLE, f"{why}; retry in {self.limits.retry_after} s",
                             headers={"Retry-After": str(self.limits.retry_after)})


class BearerKey:
    """ASGI middleware: every request but those to ``open_paths`` (the readiness probe, the review page) must carry
    ``Authorization: Bearer <key>``; without it, or with another key, a JSON 401 that says which (compared in
    constant time)."""

    def __init__(self, app, key: str, open_paths: tuple[str, ...] = ()):
        self.app, self.expected, self.open_paths = app, f"Bearer {key}".encode(), open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].removeprefix(scope.get("root_path", "")) in self.open_paths:
            return await self.app(scope, receive, send)
        sent = dict(scope["headers"]).get(b"authorization")
        if sent is not None and hmac.compare_digest(sent, self.expected):
            return await self.app(scope, receive, send)
        why = ("no Authorization header; this server needs Authorization: Bearer <API key>" if sent is None else
               "the Authorization header does not carry this server's API key (expected Bearer <API key>)")
        answer = JSONResponse({"detail": why}, HTTPStatus.UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
        await answer(scope, receive, send)
