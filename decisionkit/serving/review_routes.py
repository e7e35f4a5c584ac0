"""The review queue over HTTP: on the server that logs (``decisionkit serve RUN --log PATH``) and on its own
(``decisionkit review PATH_OR_URL``: the same routes and page over a log, no model loaded).

- ``GET /v1/reviews``        ``{"reviews": [...]}``: pending first (least confident first), then the rest, newest
                              first; ``?status=pending|reviewed|not-a-case`` filters, ``?limit=N`` (default 100)
- ``GET /v1/reviews/{id}``   one queued case
- ``POST /v1/reviews/{id}``  ``{"answers": {question: label}, "reviewer": name}`` (a question may be left out), or
                              ``{"not_a_case": true, "reviewer": name}``; 422 naming the field for a label that is
                              not an option (read as the training loader reads labels), 404 for an unknown id
- ``GET /review``             the review page (``review_page.html``): one case at a time, the state readable, the
                              model's probabilities as bars, each answer a click or a key, skip, not-a-case

The API key guards the routes as it guards the rest; the page itself holds no data and opens without it (a browser
cannot send a bearer header to open a page): it asks for the key and sends it with every call.
"""

from __future__ import annotations

from http import HTTPStatus
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import Field

from ..data.questions import Contract
from ..loop import reviews
from ..loop.log import DecisionLog
from .reading import BearerKey

PAGE_PATH = "/review"
DEFAULT_LIMIT = 100


class ReviewAnswer(Contract):
    answers: dict[str, Any] | None = Field(None, description="Question -> label, as the training loader reads "
                                                             "labels; a question may be left out.")
    reviewer: str = Field(description="Who answers: a name or an id.")
    not_a_case: bool = Field(False, description="The input is not a case of the workflow (off-domain).")


def page() -> str:
    return resources.files(__package__).joinpath("review_page.html").read_text(encoding="utf-8")


def add_review_routes(app: FastAPI, log: DecisionLog) -> None:
    """``GET /v1/reviews``, ``GET`` and ``POST /v1/reviews/{id}`` and the page at ``/review``, over ``log``."""

    @app.get("/v1/reviews")
    def list_reviews(status: str | None = None, limit: int = DEFAULT_LIMIT):
        try:
            found = reviews.queue(log, status, max(0, limit))
        except reviews.BadReview as err:
            return JSONResponse({"detail": [err.detail() | {"loc": ["query", "status"]}]},
                                HTTPStatus.UNPROCESSABLE_ENTITY)
        return {"reviews": [reviews.public(item) for item in found]}

    @app.get("/v1/reviews/{review_id}")
    def one_review(review_id: str):
        try:
            return reviews.public(reviews.review(log, review_id))
        except reviews.ReviewNotFound as err:
            return JSONResponse({"detail": str(err)}, HTTPStatus.NOT_FOUND)

    @app.post("/v1/reviews/{review_id}")
    def answer_review(review_id: str, body: ReviewAnswer):
        try:
            recorded = reviews.answer(log, review_id, body.answers, body.reviewer, body.not_a_case)
        except reviews.ReviewNotFound as err:
            return JSONResponse({"detail": str(err)}, HTTPStatus.NOT_FOUND)
        except reviews.BadReview as err:
            return JSONResponse({"detail": [err.detail()]}, HTTPStatus.UNPROCESSABLE_ENTITY)
        return {"id": review_id, **recorded.to_json(), "status": recorded.status}  # the latest answer: no second read

    @app.get(PAGE_PATH, response_class=HTMLResponse)
    def review_page() -> str:
        return page()


def review_app(where, api_key: str | None = None) -> FastAPI:
    """The review routes and page alone, over the log at ``where`` (``decisionkit review``); with ``api_key``,
    every call but the page's own must carry it as ``Authorization: Bearer``."""
    log = DecisionLog(where, audit_share=0.0, create=False)
    app = FastAPI(title="decisionkit reviews")
    add_review_routes(app, log)
    if api_key:
        app.add_middleware(BearerKey, key=api_key, open_paths=(PAGE_PATH,))
    app.state.log = log
    return app


def review(where, host: str = "127.0.0.1", port: int = 8001, api_key: str | None = None) -> None:
    """``decisionkit review``: ``review_app`` served on ``host``:``port`` until Ctrl-C or SIGTERM; the log is closed
    at the end."""
    import uvicorn

    app = review_app(where, api_key=api_key)
    print(f"reviewing {app.state.log.shown} on http://{host}:{port}{PAGE_PATH} (GET /v1/reviews, POST "
          f"/v1/reviews/ID){'; API key required' if api_key else ''}; Ctrl-C stops", flush=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        app.state.log.close()
