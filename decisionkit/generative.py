"""The generative baseline: ask the same backbone for the five answers as JSON, decode greedily, parse.

This is the "prompt an LLM, parse its JSON" pipeline the course replaces, measured honestly on the same
backbone and cases: per request the latency, the time to the first token, the tokens produced, whether the
text parses as JSON with every question answered by a valid option, whether a ``<think>`` block appeared, and
how many parsed answers match the gold.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers.generation.streamers import BaseStreamer

from . import settings
from .data import Case, Question, Split
from .latency import synchronize

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
def generate_json(backbone, case: Case, max_new_tokens: int) -> Generation:
    """Greedy decoding of the JSON answer, at most ``max_new_tokens`` tokens."""
    inputs = backbone.tokenizer(json_prompt(backbone, case), return_tensors="pt", add_special_tokens=False)
    inputs = inputs.to(backbone.device)
    clock = FirstTokenClock(backbone.device)
    start = time.perf_counter()
    out = backbone.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, streamer=clock,
                                  pad_token_id=backbone.tokenizer.eos_token_id)
    synchronize(backbone.device)
    end = time.perf_counter()
    new = out[0, inputs["input_ids"].shape[1]:]
    first = (clock.first or end) - start
    return Generation(backbone.tokenizer.decode(new, skip_special_tokens=True), (end - start) * 1e3, first * 1e3,
                      int(new.shape[0]))


@dataclass
class GenerativeResult:
    """One row per request: budget, latency, first token, tokens, parse and validity, correct answers, text."""

    requests: pd.DataFrame

    def table(self, by: str | list[str] = "budget") -> pd.DataFrame:
        r = self.requests
        return r.groupby(by).agg(requests=("case", "size"), median_ms=("latency_ms", "median"),
                                 p95_ms=("latency_ms", lambda x: float(np.percentile(x, 95))),
                                 first_token_ms=("first_token_ms", "median"), tokens=("output_tokens", "mean"),
                                 parses=("parses", "mean"), valid=("valid", "mean"), think=("think", "mean"),
                                 accuracy=("correct", "sum"), questions=("questions", "sum")
                                 ).eval("accuracy = accuracy / questions").drop(columns="questions")

    def failures(self, budget: int, n: int = 3) -> pd.DataFrame:
        bad = self.requests[(self.requests["budget"] == budget) & ~self.requests["valid"]]
        return bad[["case", "problems", "text"]].head(n)


def generative_baseline(backbone, cases: Split, budgets=(64, 256), progress: bool = True) -> GenerativeResult:
    """Generate, time and parse the JSON answers of every case at every token budget."""
    rows = []
    bar = tqdm(total=len(cases) * len(budgets), desc="generate JSON", disable=not progress or settings.progress_hidden())
    golds = [{qid: q.options[int(np.argmax(case.gold[qid].probabilities))] for qid, q in case.questions.items()}
             for case in cases]
    for budget in budgets:
        generate_json(backbone, cases[0], budget)  # warm-up
        for case, gold in zip(cases, golds):
            g = generate_json(backbone, case, budget)
            answers, problems = parse_answers(g.text, case.questions)
            rows.append({"budget": budget, "case": case.id, "workflow": case.workflow, "latency_ms": g.latency_ms,
                         "first_token_ms": g.first_token_ms, "output_tokens": g.output_tokens,
                         "parses": not any(p.startswith(("no JSON", "JSON")) for p in problems),
                         "valid": not problems, "think": "<think>" in g.text,
                         "correct": sum(answers.get(q) == a for q, a in gold.items()), "questions": len(gold),
                         "problems": "; ".join(problems), "text": g.text})
            bar.update()
    bar.close()
    return GenerativeResult(pd.DataFrame(rows))
