"""``serve_protocol.JSONErrorsProtocol`` against the uvicorn it subclasses: the version it was written for, the
internals it overrides, and what it does on a live socket (a JSON 400 for malformed HTTP, a JSON 408 for headers
that do not arrive in time, on a fresh connection and on a kept-alive one). uvicorn has no supported hook for
either behaviour (see the module's docstring): when an upgrade moves these internals, this test fails first."""

import http.client
import json
import socket
import threading
import time

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from decisionkit.course.serve_lab import free_port
from decisionkit.serving.protocol import json_errors_protocol

WRITTEN_FOR = "0.54.0"  # requirements/constraints.txt pins it; re-read H11Protocol before moving this
HEADER_TIMEOUT = 0.5  # seconds


def test_the_uvicorn_it_was_written_for():
    assert uvicorn.__version__ == WRITTEN_FOR, (
        f"uvicorn {uvicorn.__version__}: JSONErrorsProtocol overrides H11Protocol.connection_made, "
        "on_response_complete, connection_lost and send_400_response and reads its conn, transport and loop; check "
        f"them against this version (and look for a supported hook), then set WRITTEN_FOR")
    for method in ("connection_made", "on_response_complete", "connection_lost", "send_400_response"):
        assert callable(getattr(H11Protocol, method, None)), method


async def app(scope, receive, send):
    """A plain ASGI app: 200 and a JSON body for every request."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


@pytest.fixture(scope="module")
def port():
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=json_errors_protocol(HEADER_TIMEOUT),
                            lifespan="off", log_level="warning", timeout_keep_alive=30)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(timeout=30)


def read(sock: socket.socket) -> tuple[int, dict, bytes]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, dict(response.getheaders()), response.read()


def request(path: str = "/", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode()


def test_a_good_request_is_answered_by_the_app(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request(extra="Connection: close\r\n"))
        assert read(sock)[0] == 200


def test_malformed_http_gets_a_json_400(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n{}")
        status, headers, body = read(sock)
    assert status == 400 and headers["content-type"] == "application/json"
    assert "Check the request line, the headers and Content-Length" in json.loads(body)["detail"]


def test_headers_that_do_not_arrive_get_a_json_408(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: the headers never end
        status, headers, body = read(sock)
    assert status == 408 and headers["content-type"] == "application/json"
    assert json.loads(body)["detail"] == f"the request headers did not arrive within {HEADER_TIMEOUT:g} s"


def test_a_kept_alive_connection_gets_the_same_time_for_its_next_request(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request())
        assert read(sock)[0] == 200
        sock.sendall(request(extra="Connection: close\r\n"))  # the next request, in time: answered
        assert read(sock)[0] == 200
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request())
        assert read(sock)[0] == 200
        sock.sendall(b"GET / HTTP/1.1\r\n")  # the next request's headers stall
        assert read(sock)[0] == 408
