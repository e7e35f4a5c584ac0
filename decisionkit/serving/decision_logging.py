"""What the server keeps of each answer, and the ids it tells clients.

``AnswerHeaders`` (ASGI middleware on ``POST /v1/systemone``, always on): every answer carries ``X-Request-Id`` (the
client's own, when it sent a usable one; else one made here), ``X-Decisionkit-Model-Version`` (the content hash of
the model that answered: after a reload, the new one's) and ``X-Decisionkit-Workflow`` (the workflow it was read as).
The model side also says which folder answered, in a header this middleware takes out before the client sees it.
With a ``DecisionLog`` (``decisionkit serve --log``), each answered request (status 200) is recorded once its
answer is sent: the request as it came (zstd bodies decoded), the answers and routing, the version, folder and
workflow, the time from the request's arrival to its answer. Recording only queues (``loop.log``): the database is
written off the request's path.
"""

from __future__ import annotations

import re
import time
import uuid

import pydantic_core

from ..loop.log import DecisionLog

REQUEST_ID = "x-request-id"
VERSION = "x-decisionkit-model-version"
WORKFLOW = "x-decisionkit-workflow"
FOLDER = "x-decisionkit-folder"  # model side to this middleware only: never sent to a client
USABLE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def answer_headers(model, workflow: str) -> dict[str, str]:
    """The headers the model side sets on an answer of ``model`` (a loaded DecisionModel) read as ``workflow``."""
    return {VERSION: model.version or "", WORKFLOW: workflow, FOLDER: str(model.folder or "")}


class AnswerHeaders:
    """See the module docstring. ``endpoint``: the path answered; ``decode``: how the app decodes a request body
    (``reading.decoded`` with the server's limits)."""

    def __init__(self, app, endpoint: str, log: DecisionLog | None, decode):
        self.app, self.endpoint, self.log, self.decode = app, endpoint, log, decode

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].removeprefix(scope.get("root_path", "")) != self.endpoint:
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        headers = dict(scope["headers"])
        given = headers.get(REQUEST_ID.encode(), b"").decode("latin-1")
        request_id = given if USABLE_ID.match(given) else uuid.uuid4().hex
        body, answer, seen = [], [], {}

        async def receiving():
            message = await receive()
            if self.log is not None and message["type"] == "http.request":
                body.append(message.get("body", b""))
            return message

        async def sending(message):
            if message["type"] == "http.response.start":
                kept = []
                for name, value in message.get("headers", []):
                    if name.lower() in (FOLDER.encode(), VERSION.encode(), WORKFLOW.encode()):
                        seen[name.lower().decode()] = value.decode("latin-1")
                    if name.lower() != FOLDER.encode():
                        kept.append((name, value))
                kept.append((REQUEST_ID.encode(), request_id.encode()))
                seen["status"] = message["status"]
                message = {**message, "headers": kept}
            elif message["type"] == "http.response.body" and self.log is not None and seen.get("status") == 200:
                answer.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receiving, sending)
        if self.log is not None and seen.get("status") == 200:
            try:  # the answer is sent: nothing here may fail the request
                self._record(request_id, headers, b"".join(body), b"".join(answer), seen,
                             (time.perf_counter() - started) * 1000)
            except Exception as err:
                self.log.failed(err)

    def _record(self, request_id: str, headers: dict, body: bytes, answer: bytes, seen: dict, latency_ms: float):
        request = pydantic_core.from_json(self.decode(body, headers.get(b"content-encoding", b"identity").decode()))
        response = pydantic_core.from_json(answer)
        self.log.record(model=response["model"], state=request["state"], questions=request["questions"],
                        answers=response["answers"], routing=response.get("routing"),
                        version=seen.get(VERSION) or None, folder=seen.get(FOLDER) or None,
                        workflow=seen.get(WORKFLOW) or request.get("workflow"), latency_ms=latency_ms,
                        request_id=request_id)
