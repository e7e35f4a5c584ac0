"""Learning from the reviews: ``decisionkit train --data EXPORT --reviews LOG --out RUN2`` and ``decisionkit promote``.

``reviewed_cases(log, decisions, served)`` reads the cases people answered:

- a case queued because the router sent it to a human (``routed``) is a new training row, unless a hash of its id
  puts it in the *review test* (``REVIEW_TEST_SHARE``), which no model trains on;
- a case of the random audit is kept out of training altogether: the audit is a sample of what the model answered
  alone, so it measures how often those answers were wrong, before and after;
- a case marked not-a-case joins the router's off-domain check (the report's "sent to a human" of off-domain inputs).

A routed case whose state is one of the export's own validation or test rows is never trained on (the test stays
frozen).
A case's labels are its latest answer's (the report gives the reviewers' agreement where two answered). A question
the reviewer left out keeps the served model's own answer as a soft target in training (the reviewer let it stand)
and is not scored. Only cases of the export's workflows, asking the export's questions, are read; the rest are
counted and named.

``train_with_reviews`` trains on the export plus those rows (the export's test rows stay the test) and sets the new
model beside the model that served the reviews (the folder and version the log recorded) on the frozen test rows,
the review test and the audit (``comparison.compare``), in the report's ``loop`` section. ``promote(new, over)``
refuses a model worse beyond the interval on any of them; otherwise it writes ``promoted.json`` into ``over``
(``promotion``), which a server started with ``over`` takes on SIGHUP.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.atomic import write_text
from ..core.errors import MissingFile, RunError
from ..data.cases import Case, Gold, Split
from ..data.decisions import Decisions, _record
from ..data.questions import Question
from ..data.states import json_state, state_digest
from ..model.saving import REPORT_FILE, held_out_rows, model_version
from ..training.comparison import compare, worse_sets
from . import reviews
from .promotion import PROMOTED_FILE, served_folder

REVIEW_TEST_SHARE = 0.25  # of the routed cases people answered: held out to score the new model on


def in_review_test(review_id: str, share: float = REVIEW_TEST_SHARE) -> bool:
    draw = int.from_bytes(hashlib.sha256(f"review-test:{review_id}".encode()).digest()[:8], "big") / 2 ** 64
    return draw < share


@dataclass
class Reviewed:
    """The reviewed cases of a log, sorted for training (``train``), scoring (``test``: the review test; ``audit``)
    and the router's off-domain check (``not_a_case``: (workflow, state) pairs)."""

    train: list[Case]
    test: Split
    audit: Split
    not_a_case: list[tuple[str, object]]
    served: dict  # the model most of them were answered by: name, version, folder
    left_out: Counter = field(default_factory=Counter)  # why a reviewed case was not read -> how many
    agreement: dict = field(default_factory=dict)

    def counts(self) -> dict:
        return {"train": len(self.train), "review test": len(self.test), "audit": len(self.audit),
                "not a case": len(self.not_a_case), "left out": dict(self.left_out), "agreement": self.agreement}


def _served(items: list[dict]) -> dict:
    (model, version, folder), _ = Counter((i["model"], i["version"], i["folder"]) for i in items).most_common(1)[0]
    return {"model": model, "version": version, "folder": folder}


def served_model(served: dict, override: str | Path | None = None):
    """The model that served the reviews (``served``: name, version, folder as the log recorded them), loaded from
    that folder or ``override``."""
    from ..model.decision_model import load

    folder = Path(override) if override is not None else Path(served["folder"] or "")
    if not served["folder"] and override is None:
        raise MissingFile("the decision log names no folder for the model that served these reviews; pass "
                          "--served RUN")
    if not (folder / "decisionkit.json").is_file():
        raise MissingFile(f"the model that served these reviews ({served['model']}, version {served['version']}) "
                          f"was at {folder}, which holds no saved model now; pass --served RUN")
    return load(folder)


def answered_items(log) -> list[dict]:
    """The queued cases of ``log`` that someone has answered (``reviews.queue``'s items); a RunError when none is."""
    items = [i for i in reviews.queue(log) if i["status"] != "pending"]
    if not items:
        raise RunError(f"{getattr(log, 'shown', log)}: no case in the review queue has been answered yet; answer some "
                       "first (GET /v1/reviews, the review page, or decisionkit.answer)")
    return items


def reviewed_cases(items: list[dict], decisions: Decisions, model) -> Reviewed:
    """The answered cases (``answered_items``) that fit ``decisions``' workflows and questions, sorted (see the
    module docstring); ``model``: the one that answered them, whose own answers fill the questions a reviewer left
    out."""
    found = Reviewed([], Split("review test", [], "reviews"), Split("audit", [], "reviews"), [], _served(items),
                     agreement=reviews.agreement(items))
    train, test, audit = [], [], []
    held = {state_digest(c.state) for name in ("validation", "test") for c in decisions[name]}
    for item in items:
        latest = item["reviews"][-1]
        workflow, state = item["workflow"], json_state(item["state"])
        if latest["verb"] == reviews.NOT_A_CASE:
            found.not_a_case.append((workflow, state))
            continue
        trained = decisions.schema.get(workflow)
        if trained is None:
            found.left_out[f"workflow {workflow!r} is not the export's"] += 1
            continue
        asked = {q: Question.parse(q, x) for q, x in item["questions"].items()}
        if any(q not in trained or trained[q] != x for q, x in asked.items()):
            found.left_out["questions other than the export's"] += 1
            continue
        labels = latest["labels"]
        gold = {q: _one_hot(trained[q], v) for q, v in labels.items()}
        scored = Case(f"review-{item['id']}", workflow, state, {q: trained[q] for q in labels}, gold)
        if item["why"] == "audit":
            audit.append(scored)
        elif in_review_test(item["id"]):
            test.append(scored)
        elif state_digest(state) in held:  # the export's own validation or test row, sent as traffic: not trained on
            found.left_out["the export's own validation or test row"] += 1
        else:
            train.append((scored, trained))
    if train:  # the questions left out keep the served model's answer, as a soft target
        fill = Split("reviews", [Case(c.id, c.workflow, c.state, trained, {}) for c, trained in train], "reviews")
        predicted = model.predict(fill, raw=True)
        for (case, trained), probabilities in zip(train, predicted):
            gold = {q: case.gold.get(q) or Gold(np.asarray(probabilities[q], dtype=float),
                                                trained[q].options[int(np.argmax(probabilities[q]))])
                    for q in trained}
            found.train.append(Case(case.id, case.workflow, case.state, dict(trained), gold))
    found.test, found.audit = Split("review test", test, "reviews"), Split("audit", audit, "reviews")
    return found


def _one_hot(question: Question, label: str) -> Gold:
    probabilities = np.zeros(len(question.options))
    probabilities[question.options.index(label)] = 1.0
    return Gold(probabilities, label)


def with_reviews(decisions: Decisions, reviewed: Reviewed) -> Decisions:
    """``decisions`` with the reviewed training rows put first in train (a preset that caps the train rows,
    ``train_per_workflow``, keeps them all), validation and test as they were."""
    known = {c.id for split in decisions.splits.values() for c in split}
    added = [c for c in reviewed.train if c.id not in known]
    splits = dict(decisions.splits)
    splits["train"] = Split("train", added + list(decisions["train"]), decisions["train"].source)
    record = _record(decisions.record["source"], splits, decisions.schema, decisions.record["split rule"],
                     decisions.record.get("seed"), decisions.benchmark)
    record.update({k: v for k, v in decisions.record.items() if k not in record})
    record["reviews"] = {"rows added to train": len(added)}
    return Decisions(splits, decisions.schema, record, decisions.rows,
                     {**decisions.places, **{c.id: "the decision log's reviews" for c in added}})


def train_with_reviews(data, log, out, *, schema=None, preset=None, served=None, progress: bool = True,
                       overrides: dict | None = None, **reading):
    """Train on ``data`` plus the reviewed cases of ``log`` into ``out``, and set the new model beside the model
    that served the reviews on the frozen test rows, the review test and the audit (the report's ``loop``).
    ``preset``: a name or a Preset; default: the served model's own recipe (``presets.of_run``), with
    ``overrides``. ``served``: that model's folder, if not the one the log names."""
    from ..training import presets
    from ..training.pipeline import train
    from ..training.run_folder import check_out
    from ..training.trainer import decisions_of

    check_out(out)  # before anything is read: a folder of the user's files is refused at once
    items = answered_items(log)
    old = served_model(_served(items), served)
    if preset is None:
        p = presets.of_run(old.folder, **(overrides or {}))
    else:
        p = presets.preset(preset, **(overrides or {})) if isinstance(preset, str) else preset
    decisions = decisions_of(p, data, schema, **reading)
    reviewed = reviewed_cases(items, decisions, old)
    trained = train(with_reviews(decisions, reviewed), out, preset=p, progress=progress,
                    not_a_case=reviewed.not_a_case)
    sets = {"test": trained.splits["test"], "review test": reviewed.test, "audit": reviewed.audit}
    trained.report.loop = {"log": getattr(log, "shown", str(log)),
                           "served": {**reviewed.served, "folder": str(old.folder), "version": old.version},
                           "reviews": reviewed.counts(), "comparison": compare(trained.model, old, sets)}
    trained.report.save(trained.fitted.out)
    return trained


@dataclass
class Promotion:
    new: Path
    over: Path
    version: str
    replaced: str
    comparison: dict

    def line(self) -> str:
        sets = ", ".join(f"{name} {row['old']['accuracy']:.3f} -> {row['new']['accuracy']:.3f}"
                         for name, row in self.comparison.items())
        return (f"promoted {self.new} (version {self.version}) over {self.over} (was version {self.replaced}): "
                f"accuracy {sets}, not worse beyond the interval on any set; a server started with {self.over} "
                f"takes it on SIGHUP (kill -HUP PID) or its next start")


def promote(new: str | Path, over: str | Path) -> Promotion:
    """Serve ``new`` in ``over``'s place (see the module docstring), if its report's comparison with the model
    ``over`` serves now shows it not worse beyond the interval on any set. A report without such a comparison is
    compared now, on ``new``'s held-out test rows."""
    from ..model.decision_model import load

    new, over = Path(new).expanduser().absolute(), Path(over).expanduser().absolute()
    if not (new / REPORT_FILE).is_file():
        raise MissingFile(f"{new}: no {REPORT_FILE}; give the run folder decisionkit train wrote")
    current = served_folder(over)
    replaced = model_version(current)
    if current == new:
        raise RunError(f"{over} serves {new} already")
    loop = json.loads((new / REPORT_FILE).read_text(encoding="utf-8")).get("loop")
    if loop and loop["served"]["version"] == replaced:
        comparison = loop["comparison"]
    else:
        rows = held_out_rows(new)  # its test rows, kept in its folder: both models answer them now
        comparison = compare(load(new), load(current), {"test": rows})
    worse = worse_sets(comparison)
    if worse:
        said = "; ".join(f"{name}: {', '.join(metrics)}" for name, metrics in worse.items())
        raise RunError(f"not promoted: {new} is worse than the model {over} serves (version {replaced}) beyond the "
                       f"95% interval on {said}; {over} is unchanged")
    version = model_version(new)
    write_text(over / PROMOTED_FILE, json.dumps(
        {"run": str(new), "version": version, "over version": replaced,
         "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "comparison": comparison}, indent=2))
    return Promotion(new, over, version, replaced, comparison)
