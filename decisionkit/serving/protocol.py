"""uvicorn's HTTP/1.1 protocol with JSON errors and a header timeout: the one place decisionkit reaches into
uvicorn's internals.

uvicorn answers a request it cannot parse (a Content-Length of -5, say) with a plain-text 400, and waits for a
request's headers without end. It has no supported hook for either: its settings choose a protocol class
(``http=``), bound the time between requests (``timeout_keep_alive``) or a request's size
(``h11_max_incomplete_event_size``), not the time its headers take, and the 400 is written by the protocol
(``H11Protocol.send_400_response``) before any ASGI app sees the request, so neither Starlette's middleware nor
FastAPI's exception handlers can shape it. So ``JSONErrorsProtocol`` subclasses uvicorn's h11 protocol, given to
uvicorn through its ``http=`` setting, and overrides four of its methods. ``tests/test_serve_protocol.py`` pins the
uvicorn version this was written against and checks both behaviours on a live socket, so that an upgrade that moves
those internals fails there first.
"""

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class JSONErrorsProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, whose 400 for a request it cannot parse is JSON like every other answer, and
    which gives a client ``header_timeout`` seconds to send its request line and headers (uvicorn itself waits
    for them without end): a connection that dribbles headers gets a JSON 408 and is closed."""

    header_timeout: float  # seconds; ``json_errors_protocol`` makes the class with it (the server's read timeout)
    header_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_headers()  # the next request on a kept-alive connection gets the same time

    def connection_lost(self, exc: Exception | None) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        self.header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _headers_late(self) -> None:
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return  # the headers came; the body has its own timeout (RequestLimits)
        if self.conn.our_state is h11.IDLE:
            self._send_json_error(408, b"Request Timeout", f"the request headers did not arrive within "
                                                         f"{self.header_timeout:g} s")
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._send_json_error(400, b"Bad Request", f"{msg} Check the request line, the headers and Content-Length.")

    def _send_json_error(self, status: int, reason: bytes, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=status, headers=headers, reason=reason), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()




def json_errors_protocol(header_timeout: float) -> type[JSONErrorsProtocol]:
    """``JSONErrorsProtocol`` with ``header_timeout`` seconds for a request's line and headers (uvicorn's ``http=``
    takes a class, and builds one protocol per connection)."""
    return type("JSONErrorsProtocol", (JSONErrorsProtocol,), {"header_timeout": header_timeout})
