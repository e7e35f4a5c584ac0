"""What a server is told: its limits per request and its batching. Plain dataclasses, so the command line builds its
options from them without importing the server (LitServe, FastAPI)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one request may cost the server."""

    max_body_bytes: int = 256 * 1024  # a typed-decisions state is a few KB; anything near this is a mistake
    read_timeout: float = 10.0  # seconds for a body to arrive: a slow or short body must not hold the server
    max_in_flight: int = 64  # requests to the model at once; more are told to retry (503 + Retry-After)
    max_reading: int = 512  # requests still sending their bodies (each holds a socket and its bytes); more: 503
    retry_after: int = 2  # seconds, in that 503's Retry-After header
    request_timeout: float = 120.0  # seconds a request may wait for the model (LitServe answers 504 past it)


@dataclass(frozen=True)
class Batching:
    """LitServe's dynamic batching: requests arriving within ``timeout`` seconds share one forward pass."""

    max_batch_size: int = 16  # 1 turns batching off: one request per forward pass
    timeout: float = 0.01
