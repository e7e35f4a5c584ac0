"""Closing the loop in the lab (notebook 11): a served model meets a kind of claim its export never had, people
review what it routes to them, and the reviews train the model that replaces it.

One call per notebook step, each returning a small dataclass with a ``table()`` (and, for the curve, a ``figure()``
from ``core.plots``):

- ``drift_traffic(n, seed)`` / ``test_traffic(split)``: requests with their gold labels, new kind and old kind;
- ``send(url, model, traffic)``: each request posted to the server (``/v1/systemone``, 127.0.0.1): per request the
  kind, the router's verdict, the answering model's version (``X-Decisionkit-Model-Version``) and whether each
  answer's top option is the gold label (``Sent``: share routed to a human and accuracy, per kind);
- ``review(url, gold, reviewer, limit)``: a simulated reviewer answers pending reviews through ``/v1/reviews``
  with the generator's own labels (``Reviewed``);
- ``retrain(...)``: ``loop.retrain.train_with_reviews`` and its comparison with the served model (``Retrained``);
- ``promote_live(new, over, server, ...)``: ``promote`` then SIGHUP, waiting until the answers carry the new
  version (``Promoted``);
- ``audit_errors(url)``: the audited cases answered, per model version: the share the reviewer corrected;
- ``Curve``: accuracy on a fixed held-out set of new-kind claims and share routed, against reviews used.

Everything is bounded: a count of requests and reviews per call, a timeout per HTTP call and for the reload.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import httpx
import pandas as pd

from ..core.plots import review_curve
from ..data.expense_claims import drift_claims
from ..loop.reviews import top_label
from ..serving.app import ENDPOINT
from ..serving.decision_logging import VERSION

TIMEOUT_S = 300.0  # one HTTP call, on two busy cores
RELOAD_S = 300.0  # the promoted model loaded beside the answering one after SIGHUP
NEW, OLD = "new kind (home office)", "old kind (test rows)"
REQUESTS = itertools.count()  # request ids: the claim and a count, so the audit draws the same cases on every run


@dataclass
class Request:
    kind: str  # NEW or OLD
    claim_id: str
    state: dict
    gold: dict[str, str]  # question -> label


def drift_traffic(n: int, seed: int) -> list[Request]:
    """``n`` home-office claims (``expense_claims.drift_claims``) with their generator labels."""
    return [Request(NEW, state["claim_id"], state, labels) for state, labels in drift_claims(n, seed)]


def test_traffic(cases, limit: int | None = None) -> list[Request]:
    """The export's test rows (a ``Split`` of the claims; the first ``limit`` of them) with their labels."""
    return [Request(OLD, c.state["claim_id"], c.state, {q: g.label for q, g in c.gold.items()})
            for c in list(cases)[:limit]]


@dataclass
class Sent:
    """What the server answered, one row per request: kind, claim, version, verdict, correct answers."""

    rows: pd.DataFrame

    def table(self) -> pd.DataFrame:
        """Per kind: requests, the share the router sent to a human, and the accuracy of the answers (every
        question of every request against the generator's labels, routed or not)."""
        by = self.rows.groupby("kind")
        return pd.DataFrame({"requests": by.size(), "sent to a human": by["human"].mean(),
                             "accuracy": by["accuracy"].mean()}).rename_axis("kind")

    def versions(self) -> list[str]:
        return sorted(self.rows["version"].unique())


def send(url: str, model: str, workflow: str, questions: dict, traffic: Sequence[Request],
         max_requests: int = 500) -> Sent:
    """Post each request (at most ``max_requests``) to the server at ``url``, one after another."""
    if len(traffic) > max_requests:
        raise ValueError(f"{len(traffic)} requests, more than max_requests={max_requests}")
    rows = []
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as http:
        for r in traffic:
            response = http.post(ENDPOINT, json={"model": model, "workflow": workflow, "state": r.state,
                                                 "questions": questions},
                                 headers={"X-Request-Id": f"{r.claim_id}.{next(REQUESTS)}"})  # the audit's draw
            response.raise_for_status()
            body = response.json()
            correct = [top_label(body["answers"][q]) == label for q, label in r.gold.items()]
            rows.append({"kind": r.kind, "claim": r.claim_id, "version": response.headers.get(VERSION),
                         "human": body["routing"]["verdict"] == "human", "accuracy": sum(correct) / len(correct)})
    return Sent(pd.DataFrame(rows))


@dataclass
class Reviewed:
    """The reviews one round answered: per review, why it was queued, the claim's kind and the verb recorded."""

    rows: pd.DataFrame
    skipped: int  # pending reviews left for a person: not drawn by this reviewer (the frozen test rows routed)

    def table(self) -> pd.DataFrame:
        if self.rows.empty:
            return pd.DataFrame(columns=["answered", "accepted", "corrected"])
        table = self.rows.groupby(["why", "kind"])["verb"].agg(
            answered="size", accepted=lambda v: int((v == "accept").sum()),
            corrected=lambda v: int((v == "correct").sum()))
        return table

    def routed_new(self) -> int:
        return int(((self.rows["why"] == "routed") & (self.rows["kind"] == NEW)).sum()) if len(self.rows) else 0


def review(url: str, gold: dict[str, Request], reviewer: str, limit: int, frozen: set[str] = frozenset()) -> Reviewed:
    """A simulated reviewer: ``GET /v1/reviews?status=pending`` (least confident first), then for each case whose
    claim is in ``gold`` (at most ``limit`` of those routed, and every audited one), ``POST /v1/reviews/{id}`` with
    the generator's labels. A routed claim in ``frozen`` (the export's test rows) is left pending, so that no test
    row is trained on; audited ones are answered (the audit is never trained on)."""
    rows, skipped, routed = [], 0, 0
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as http:
        pending = http.get("/v1/reviews", params={"status": "pending", "limit": 1000})
        pending.raise_for_status()
        for item in pending.json()["reviews"]:
            claim = (item["state"] or {}).get("claim_id") if isinstance(item["state"], dict) else None
            if claim not in gold or (item["why"] == "routed" and (claim in frozen or routed >= limit)):
                skipped += 1
                continue
            routed += item["why"] == "routed"
            answered = http.post(f"/v1/reviews/{item['id']}", json={"answers": gold[claim].gold,
                                                                     "reviewer": reviewer})
            answered.raise_for_status()
            rows.append({"id": item["id"], "why": item["why"], "kind": gold[claim].kind,
                         "version": item["version"], "verb": answered.json()["verb"]})
    return Reviewed(pd.DataFrame(rows, columns=["id", "why", "kind", "version", "verb"]), skipped)


def audit_errors(url: str, versions: dict[str, str]) -> pd.DataFrame:
    """The audited cases answered so far, per model (``versions``: version -> the name shown): how many, and the
    share where the reviewer corrected the model's answer (its error rate on the cases it answered alone)."""
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as http:
        done = http.get("/v1/reviews", params={"status": "reviewed", "limit": 1000})
        done.raise_for_status()
    rows = [{"model": versions.get(i["version"], i["version"]), "corrected": i["reviews"][-1]["verb"] == "correct"}
            for i in done.json()["reviews"] if i["why"] == "audit"]
    table = pd.DataFrame(rows, columns=["model", "corrected"]).groupby("model")["corrected"].agg(
        ["size", "mean"]).rename(columns={"size": "audited cases answered", "mean": "share corrected"})
    return table.reindex([v for v in versions.values() if v in table.index])


@dataclass
class Retrained:
    """A model trained on the export plus the reviews, beside the model that served them."""

    folder: Path
    version: str
    loop: dict

    def table(self) -> pd.DataFrame:
        from ..training.comparison import comparison_table

        return comparison_table(self.loop)

    def used(self) -> int:
        return self.loop["reviews"]["train"]


def retrain(data, log: str | Path, out: str | Path, overrides: dict, **reading) -> Retrained:
    """``train_with_reviews(data, log, out)`` with the served model's own recipe and ``overrides``: the export's
    test rows stay the test; compared with the served model on them, on the review test and on the audit."""
    from ..loop.retrain import train_with_reviews
    from ..model.saving import model_version

    trained = train_with_reviews(data, log, out, overrides=overrides, progress=False, **reading)
    return Retrained(Path(out), model_version(Path(out)), trained.report.loop)


@dataclass
class Promoted:
    version: str  # the version answering now (the replaced one where the promotion was refused)
    replaced: str
    seconds: float  # from SIGHUP to the first answer of the new version (NaN where refused)
    refused: str | None = None  # why ``promote`` refused the new model: the sets and metrics worse beyond the interval

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"version": [self.replaced, self.version]}, index=["before", "after"])


def promote_live(new: str | Path, over: str | Path, server, model: str, workflow: str, questions: dict,
                 probe: Request, timeout: float = RELOAD_S) -> Promoted:
    """``promote(new, over)``, then SIGHUP to the server started with ``over``; returns once an answer carries the
    new model's version (a TimeoutError after ``timeout`` seconds). A promotion ``promote`` refuses (the new model
    worse beyond the interval on some set) sends no signal and returns with ``refused`` saying on what."""
    from ..core.errors import RunError
    from ..loop.promotion import served_folder
    from ..loop.retrain import promote
    from ..model.saving import model_version

    try:
        promotion = promote(new, over)
    except RunError as err:
        current = model_version(served_folder(Path(over).absolute()))
        said = str(err).split("beyond the 95% interval on ", 1)[-1].split(";", 1)[0]
        return Promoted(current, current, float("nan"), f"worse beyond the 95% interval on {said}")
    os.kill(server.process.pid, signal.SIGHUP)
    start = time.monotonic()
    body = {"model": model, "workflow": workflow, "state": probe.state, "questions": questions}
    with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
        while time.monotonic() - start < timeout:
            if http.post(ENDPOINT, json=body).headers.get(VERSION) == promotion.version:
                return Promoted(promotion.version, promotion.replaced, time.monotonic() - start)
            time.sleep(1.0)
    raise TimeoutError(f"the server still answers with version {promotion.replaced} {timeout:g} s after SIGHUP")


@dataclass
class Curve:
    """Per round: reviews used to train (0: the model trained on the export alone), accuracy on the held-out
    new-kind claims and the share of them sent to a human."""

    rows: list[dict] = field(default_factory=list)

    def add(self, reviews_used: int, held_out: Sent | None, promoted: bool = True) -> None:
        """One round; ``held_out``: the held-out claims as the promoted model answered them (None where the round's
        model was refused: it never served, so nothing was measured)."""
        row = held_out.table().loc[NEW] if held_out is not None else {"accuracy": float("nan"),
                                                                      "sent to a human": float("nan"), "requests": 0}
        self.rows.append({"reviews used": reviews_used, "promoted": promoted, "accuracy": float(row["accuracy"]),
                          "sent to a human": float(row["sent to a human"]), "held-out claims": int(row["requests"])})

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows).rename_axis("round")

    def figure(self):
        return review_curve(self.table())
