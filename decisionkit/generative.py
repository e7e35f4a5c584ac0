"""The generative baselines: what an engineer would ship instead of decision heads, on the same backbone.

- **Free JSON**: ask for the five answers as JSON, decode greedily, parse (the "prompt an LLM, parse its JSON"
  pipeline the course replaces).
- **Constrained JSON**: the same prompt, decoded through the JSON schema of the answers (``answer_schema``) with
  llguidance masking every token that would break it, so the reply is valid by construction and ends when the
  object closes. Chosen by measurement: xgrammar ran as fast on this CPU (3.3-3.9 s for five answers, both)
  but pulls triton on Linux; lm-format-enforcer 0.11 refuses transformers 5; llguidance is one wheel.
- **Option scoring**: no generation; each question's options scored by the next-token probability of their
  letters (``zeroshot``), timed per case.

Per request: the latency, the time to the first token, the tokens produced, whether the text parses as JSON with
every question answered by a valid option, whether a ``<think>`` block appeared, and how many answers match the
gold. A generated answer is one option, with no distribution: its KL and ECE are not defined (``ab_test``
reports them for the methods that give probabilities).
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from . import settings
from .data import Case, Question, Split
from .latency import Timing, decision_timings, synchronize, time_calls
from .metrics import Scores, expected_calibration_error, score

SYSTEM = ("You read a workflow state and answer every question about it. Reply with one JSON object only, "
          "mapping each question id to its answer, and nothing else.")
THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def allowed(question: Question) -> str:
    if question.type == "noul":
        return "true or false"
    if question.type == "score":
        return f"an integer level from 0 to {len(question.options) - 1}"
    return "one of " + ", ".join(f'"{o}"' for o in question.options)


def json_prompt(backbone, case: Case) -> str:
    """The chat prompt: the state, each question with its allowed answers, and the expected JSON shape."""
    lines = [case.text, "", "Questions:"]
    for qid, q in case.questions.items():
        lines.append(f"- {qid}: {q.instructions} Answer: {allowed(q)}.")
    example = ", ".join(f'"{qid}": ...' for qid in case.questions)
    lines += ["", f"Reply as JSON: {{{example}}}"]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]
    return backbone.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def answer_schema(case: Case) -> dict:
    """The JSON schema of one reply: every question required, each with only its valid answers (noul: a boolean,
    choice: one of its options, score: one of its integer levels), compact separators, nothing else."""
    properties = {}
    for qid, q in case.questions.items():
        if q.type == "noul":
            properties[qid] = {"type": "boolean"}
        elif q.type == "choice":
            properties[qid] = {"type": "string", "enum": list(q.options)}
        else:
            properties[qid] = {"type": "integer", "enum": [int(o) for o in q.options]}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False,
            "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}


@functools.lru_cache(maxsize=4)
def _guidance_tokenizer(tokenizer):
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer)  # about a second: the vocabulary as llguidance reads it


class SchemaConstraint(LogitsProcessor):
    """At every decoding step, masks the tokens that would break ``schema`` (llguidance), so the reply is valid
    JSON of that schema by construction; once the object closes, only the end-of-sequence token is allowed."""

    def __init__(self, tokenizer, schema: dict):
        import llguidance
        import llguidance.torch

        self._fill, self._apply = llguidance.torch.fill_next_token_bitmask, llguidance.torch.apply_token_bitmask_inplace
        words = _guidance_tokenizer(tokenizer)
        self.matcher = llguidance.LLMatcher(words, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)))
        self.mask = llguidance.torch.allocate_token_bitmask(1, words.vocab_size)
        self.prompt_length: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        else:  # the token chosen at the previous step
            self.matcher.consume_token(int(input_ids[0, -1]))
        self._fill(self.matcher, self.mask, 0)
        self._apply(scores, self.mask.to(scores.device))
        return scores


class FirstTokenClock(BaseStreamer):
    """A streamer that notes when ``generate`` hands over its first new token (the prompt comes first)."""

    def __init__(self, device: str):
        self.device, self.calls, self.first = device, 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # call 1 is the prompt
            synchronize(self.device)
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def parse_answers(text: str, questions: dict[str, Question]) -> tuple[dict[str, str], list[str]]:
    """The valid answers found in ``text`` (option keys) and what was wrong. A ``<think>`` block is skipped; the
    first ``{...}`` object is read."""
    body = THINK.sub("", text)
    start = body.find("{")
    if start < 0:
        return {}, ["no JSON object"]
    try:
        obj, _ = json.JSONDecoder().raw_decode(body[start:])
    except json.JSONDecodeError as err:
        return {}, [f"JSON does not parse ({err.msg})"]
    if not isinstance(obj, dict):
        return {}, ["JSON is not an object"]
    answers, problems = {}, []
    for qid, q in questions.items():
        if qid not in obj:
            problems.append(f"{qid}: missing")
            continue
        value = obj[qid]
        key = str(value).lower() if q.type == "noul" and isinstance(value, (bool, str)) else str(value)
        if key in q.options:
            answers[qid] = key
        else:
            problems.append(f"{qid}: {value!r} is not {allowed(q)}")
    return answers, problems


@dataclass
class Generation:
    text: str
    latency_ms: float
    first_token_ms: float
    output_tokens: int


@torch.inference_mode()
def generate_json(backbone, case: Case, max_new_tokens: int, constrained: bool = False) -> Generation:
    """Greedy decoding of the JSON answer, at most ``max_new_tokens`` tokens; ``constrained``: through the answers'
    JSON schema (the constraint's setup is part of the request, and of its time)."""
    start = time.perf_counter()
    inputs = backbone.tokenizer(json_prompt(backbone, case), return_tensors="pt", add_special_tokens=False)
    inputs = inputs.to(backbone.device)
    clock = FirstTokenClock(backbone.device)
    processors = LogitsProcessorList([SchemaConstraint(backbone.tokenizer, answer_schema(case))] if constrained else [])
    out = backbone.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, streamer=clock,
                                  logits_processor=processors, pad_token_id=backbone.tokenizer.eos_token_id)
    synchronize(backbone.device)
    end = time.perf_counter()
    new = out[0, inputs["input_ids"].shape[1]:]
    first = (clock.first or end) - start
    return Generation(backbone.tokenizer.decode(new, skip_special_tokens=True), (end - start) * 1e3, first * 1e3,
                      int(new.shape[0]))


@dataclass
class GenerativeResult:
    """One row per request: method ("free" or "constrained"), budget, latency, first token, tokens, parse and
    validity, correct answers, text. ``table`` adds the decoding cost per token after the first: the prompt's
    prefill is paid once (the first token), then every token costs one more forward step."""

    requests: pd.DataFrame

    def table(self, by: str | list[str] = ("method", "budget")) -> pd.DataFrame:
        r = self.requests.assign(ms_per_token=lambda f: (f["latency_ms"] - f["first_token_ms"])
                                 / (f["output_tokens"] - 1).clip(lower=1))
        return r.groupby(list(by) if isinstance(by, tuple) else by).agg(
            requests=("case", "size"), median_ms=("latency_ms", "median"),
            p95_ms=("latency_ms", lambda x: float(np.percentile(x, 95))),
            first_token_ms=("first_token_ms", "median"), ms_per_token=("ms_per_token", "median"),
            tokens=("output_tokens", "mean"),
            parses=("parses", "mean"), valid=("valid", "mean"), think=("think", "mean"),
            accuracy=("correct", "sum"), questions=("questions", "sum")
        ).eval("accuracy = accuracy / questions").drop(columns="questions")

    def failures(self, budget: int, n: int = 3, method: str = "free") -> pd.DataFrame:
        r = self.requests
        bad = r[(r["method"] == method) & (r["budget"] == budget) & ~r["valid"]]
        return bad[["case", "problems", "text"]].head(n)

    def examples(self, budget: int, n: int = 2, chars: int = 300) -> pd.DataFrame:
        """What replies look like: ``n`` free replies that failed at ``budget`` and ``n`` constrained replies,
        cut to ``chars`` characters."""
        free = self.failures(budget, n).assign(method=f"free, {budget} tokens")
        constrained = self.requests[self.requests["method"] == "constrained"].head(n).assign(method="constrained")
        table = pd.concat([free, constrained])[["method", "case", "problems", "text"]]
        return table.assign(text=table["text"].str.slice(0, chars)).reset_index(drop=True)


def generative_baseline(backbone, cases: Split, budgets=(64, 256), constrained_budget: int | None = None,
                        progress: bool = True) -> GenerativeResult:
    """Generate, time and parse the JSON answers of every case: free at every token budget, and constrained to the
    answers' schema at ``constrained_budget`` (default: the largest budget; ``0``: not at all)."""
    runs = [("free", b) for b in budgets]
    constrained_budget = max(budgets) if constrained_budget is None else constrained_budget
    if constrained_budget:
        runs.append(("constrained", constrained_budget))
    rows = []
    bar = tqdm(total=len(cases) * len(runs), desc="generate JSON", disable=not progress or settings.progress_hidden())
    golds = [{qid: q.options[int(np.argmax(case.gold[qid].probabilities))] for qid, q in case.questions.items()}
             for case in cases]
    for method, budget in runs:
        generate_json(backbone, cases[0], budget, method == "constrained")  # warm-up
        for case, gold in zip(cases, golds):
            g = generate_json(backbone, case, budget, method == "constrained")
            answers, problems = parse_answers(g.text, case.questions)
            rows.append({"method": method, "budget": budget, "case": case.id, "workflow": case.workflow,
                         "latency_ms": g.latency_ms, "first_token_ms": g.first_token_ms,
                         "output_tokens": g.output_tokens,
                         "parses": not any(p.startswith(("no JSON", "JSON")) for p in problems),
                         "valid": not problems, "think": "<think>" in g.text,
                         "correct": sum(answers.get(q) == a for q, a in gold.items()), "questions": len(gold),
                         "problems": "; ".join(problems), "text": g.text})
            bar.update()
    bar.close()
    return GenerativeResult(pd.DataFrame(rows))


def option_scoring(backbone, cases: Split, max_length: int = 512) -> tuple[Timing, list[dict[str, np.ndarray]]]:
    """The zero-shot path, timed per case: every question's options scored by the next-token probability of their
    letters, the state encoded once per case. Returns the timing and the answer distributions."""
    from .zeroshot import zero_shot_predictions

    predictions: list = []

    def one(i: int) -> None:
        predictions.append(zero_shot_predictions(backbone, Split(cases.name, [cases[i]], cases.source),
                                                 max_length, progress=False)[0])

    timing = time_calls("option scoring (log-prob)", one, range(len(cases)), warmup=0, device=backbone.device)
    return timing, predictions


AB_COLUMNS = ["p50 ms", "p95 ms", "p99 ms", "first token ms", "valid", "accuracy", "kl", "ece", "x decision p50"]


@dataclass
class ABResult:
    """The decision model against the generative baselines on the same backbone, cases and machine."""

    requests: pd.DataFrame  # one row per method and case: method, case, workflow, latency_ms, first_token_ms, valid,
    #                         correct, questions
    scores: dict[str, Scores]  # per method that gives distributions: per-decision accuracy, KL, ECE
    generative: GenerativeResult = field(repr=False)

    def table(self, by: str | None = None) -> pd.DataFrame:
        """p50 / p95 / p99 latency, time to first token, validity, accuracy, KL and ECE per method (and per
        ``by``, e.g. "workflow"); the last column is each p50 over the decision model's."""
        keys = ["method"] + ([by] if by else [])
        r = self.requests
        table = r.groupby(keys, sort=False).agg(**{
            **{f"p{q} ms": ("latency_ms", lambda x, q=q: float(np.percentile(x, q))) for q in (50, 95, 99)},
            "first token ms": ("first_token_ms", "median"), "valid": ("valid", "mean"),
            "correct": ("correct", "sum"), "questions": ("questions", "sum")})
        table["accuracy"] = table.pop("correct") / table.pop("questions")
        calibration = {}
        for method, s in self.scores.items():
            for key, d in (s.decisions.groupby(by) if by else [(None, s.decisions)]):
                calibration[(method, key) if by else method] = {
                    "kl": d["kl"].mean(), "ece": expected_calibration_error(d["confidence"], d["correct"], s.ece_bins)}
        table[["kl", "ece"]] = pd.DataFrame.from_dict(calibration, orient="index").reindex(table.index).to_numpy()
        decision = table.loc[DECISION, "p50 ms"]  # one value, or one per ``by`` group
        table["x decision p50"] = table["p50 ms"].to_numpy() / (
            decision.reindex(table.index.get_level_values(by)).to_numpy() if by else float(decision))
        return table[AB_COLUMNS]

    def figure(self):
        from .plots import latency_boxes

        return latency_boxes([Timing(m, g["latency_ms"].to_numpy()) for m, g in
                              self.requests.groupby("method", sort=False)], "Latency per request, five answers")


DECISION = "decision model"


def ab_test(model, cases: Split, budgets=(64, 256), constrained_budget: int | None = None,
            progress: bool = True) -> ABResult:
    """Time and score, on ``cases``: the decision model (one pass, every answer), option scoring, JSON constrained
    to the answers' schema, and free JSON at every budget, all on the model's backbone."""
    decision = decision_timings(model, cases)["tokenize + forward + heads"]
    probabilities, confidences = model.outputs(cases)
    scoring, scored = option_scoring(model.backbone, cases, model.spec.max_length)
    generated = generative_baseline(model.backbone, cases, budgets, constrained_budget, progress)
    gold = [{qid: int(np.argmax(c.gold[qid].probabilities)) for qid in c.questions} for c in cases]

    def rows(method: str, timing: Timing, predictions) -> list[dict]:
        return [{"method": method, "case": c.id, "workflow": c.workflow, "latency_ms": ms, "first_token_ms": np.nan,
                 "valid": True, "correct": sum(int(np.argmax(p[q])) == g[q] for q in c.questions),
                 "questions": len(c.questions)} for c, ms, p, g in zip(cases, timing.samples_ms, predictions, gold)]

    g = generated.requests.assign(method=lambda f: np.where(f["method"] == "constrained", "constrained JSON",
                                                            "free JSON, " + f["budget"].astype(str) + " tokens"))
    requests = pd.concat([pd.DataFrame(rows(DECISION, decision, probabilities)),
                          pd.DataFrame(rows(scoring.name, scoring, scored)),
                          g[["method", "case", "workflow", "latency_ms", "first_token_ms", "valid", "correct",
                             "questions"]]], ignore_index=True)
    return ABResult(requests, {DECISION: score(cases, probabilities, confidences), scoring.name: score(cases, scored)},
                    generated)
