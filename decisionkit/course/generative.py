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
reports them for the methods that give probabilities; ``ab.py`` sets them beside the decision model).

Every method computes in the backbone's compute dtype, ``backbone.precision`` (what ``precision.choose`` picked for
the device when the backbone loaded), through its one context, ``Precision.autocast()``: the decision pass enters it
in ``features.hidden_states``, generation and option scoring here. ``ComputeDtype`` notes the dtype the backbone's
first linear layer really produced during each method, so the A/B records it per request instead of assuming it.
Under bfloat16, generation also casts the frozen weights once per request (``Precision.frozen_weights_cast``), as
the decision pass's one forward does through autocast: without it, autocast cast every weight again for every
generated token, and decoding ran slower in bfloat16 than in float32 on the AMD CPU measured. Each request pays one
cast, whatever the method.

None of the generative baselines is trained: they ask the backbone as it is (zero-shot). ``training_cost`` measures
what training one on the gold replies would cost here, at least, so that a notebook can say why none was.
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from ..core import settings
from ..core.environment import synchronize
from ..data.cases import Case, Split
from ..data.questions import Question
from .latency import Timing, tail_percentile, time_calls

SYSTEM = ("You read a workflow state and answer every question about it. Reply with one JSON object only, "
          "mapping each question id to its answer, and nothing else.")
THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
WARMUP = 1  # untimed calls before each method's timed ones (the first call pays one-time costs)


class ComputeDtype:
    """While entered, notes the dtype the backbone's first linear layer produces on every forward pass (bfloat16
    under bfloat16 autocast, float32 without it): the dtype a method really computed in. ``dtype`` joins what was
    seen ("none" if the backbone never ran)."""

    def __init__(self, backbone):
        self.layer = next(m for m in backbone.body.modules() if isinstance(m, nn.Linear))
        self.seen: set[str] = set()

    def __enter__(self) -> "ComputeDtype":
        self.handle = self.layer.register_forward_hook(
            lambda module, args, out: self.seen.add(str(out.dtype).removeprefix("torch.")))
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    @property
    def dtype(self) -> str:
        return "+".join(sorted(self.seen)) or "none"


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
    """Greedy decoding of the JSON answer, at most ``max_new_tokens`` tokens, in the backbone's compute dtype;
    ``constrained``: through the answers' JSON schema (the constraint's setup is part of the request, and of its
    time)."""
    start = time.perf_counter()
    inputs = backbone.tokenizer(json_prompt(backbone, case), return_tensors="pt", add_special_tokens=False)
    inputs = inputs.to(backbone.device)
    clock = FirstTokenClock(backbone.device)
    processors = LogitsProcessorList([SchemaConstraint(backbone.tokenizer, answer_schema(case))] if constrained else [])
    with backbone.precision.autocast(), backbone.precision.frozen_weights_cast(backbone.model):
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
    validity, correct answers, the compute dtype, text. ``table`` adds the decoding cost per token after the first:
    the prompt's prefill is paid once (the first token), then every token costs one more forward step."""

    requests: pd.DataFrame

    def table(self, by: str | list[str] = ("method", "budget")) -> pd.DataFrame:
        """Per method and budget: requests, median and tail latency (p99 from ``P99_MIN_TIMINGS`` requests, else
        p90), first token, cost per later token, tokens, parse and validity shares, think blocks, accuracy."""
        keys = list(by) if isinstance(by, tuple) else by
        r = self.requests.assign(ms_per_token=lambda f: (f["latency_ms"] - f["first_token_ms"])
                                 / (f["output_tokens"] - 1).clip(lower=1))
        tail = tail_percentile(int(r.groupby(keys).size().min()))
        return r.groupby(keys).agg(
            requests=("case", "size"), median_ms=("latency_ms", "median"),
            **{f"p{tail}_ms": ("latency_ms", lambda x: float(np.percentile(x, tail)))},
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
    answers' schema at ``constrained_budget`` (default: the largest budget; ``0``: not at all). Each request
    records the dtype the backbone computed in (``ComputeDtype``)."""
    runs = [("free", b) for b in budgets]
    constrained_budget = max(budgets) if constrained_budget is None else constrained_budget
    if constrained_budget:
        runs.append(("constrained", constrained_budget))
    rows = []
    bar = tqdm(total=len(cases) * len(runs), desc="generate JSON", disable=not progress or settings.progress_hidden())
    golds = [{qid: q.options[case.gold[qid].top] for qid, q in case.questions.items()}
             for case in cases]
    for method, budget in runs:
        for case in list(cases)[:WARMUP]:
            generate_json(backbone, case, budget, method == "constrained")
        for case, gold in zip(cases, golds):
            with ComputeDtype(backbone) as seen:
                g = generate_json(backbone, case, budget, method == "constrained")
            answers, problems = parse_answers(g.text, case.questions)
            rows.append({"method": method, "budget": budget, "case": case.id, "workflow": case.workflow,
                         "latency_ms": g.latency_ms, "first_token_ms": g.first_token_ms,
                         "output_tokens": g.output_tokens,
                         "parses": not any(p.startswith(("no JSON", "JSON")) for p in problems),
                         "valid": not problems, "think": "<think>" in g.text,
                         "correct": sum(answers.get(q) == a for q, a in gold.items()), "questions": len(gold),
                         "compute_dtype": seen.dtype, "problems": "; ".join(problems), "text": g.text})
            bar.update()
    bar.close()
    return GenerativeResult(pd.DataFrame(rows))


def option_scoring(backbone, cases: Split, max_length: int = 512,
                   warmup: int = WARMUP) -> tuple[Timing, list[dict[str, np.ndarray]]]:
    """The zero-shot path, timed per case after ``warmup`` untimed cases, in the backbone's compute dtype: every
    question's options scored by the next-token probability of their letters, the state encoded once per case.
    Returns the timing and the answer distributions, in case order."""
    from ..training.zeroshot import zero_shot_predictions

    predictions: dict[int, dict[str, np.ndarray]] = {}

    def one(i: int) -> None:
        with backbone.precision.autocast():
            predictions[i] = zero_shot_predictions(backbone, Split(cases.name, [cases[i]], cases.source),
                                                   max_length, progress=False)[0]

    timing = time_calls("option scoring (log-prob)", one, range(len(cases)), warmup, device=backbone.device)
    return timing, [predictions[i] for i in range(len(cases))]


def gold_reply(case: Case) -> str:
    """The reply a generative baseline would be trained to write: every question's gold top option as
    ``answer_schema`` types it (a boolean, an integer level, an option), in the separators it asks for."""
    values: dict = {}
    for qid, q in case.questions.items():
        option = q.options[case.gold[qid].top]
        values[qid] = option == "true" if q.type == "noul" else int(option) if q.type == "score" else option
    return json.dumps(values, separators=(", ", ": "))


@dataclass
class TrainingCost:
    """What training a generative baseline on the gold replies would cost on this machine, at the least: one
    teacher-forced forward and backward pass per case (JSON prompt + gold reply, the loss on the reply), batch 1,
    gradients through every layer down to the input embeddings, none for the weights and no optimizer step. LoRA or
    a full fine-tune pays all of this and more, every epoch."""

    seconds_per_case: float  # median over the timed cases
    tokens_per_case: float  # median prompt + reply tokens
    cases_timed: int
    train_cases: int  # the cases one epoch reads
    compute_dtype: str  # what the backbone computed in (``ComputeDtype``)

    @property
    def epoch_minutes(self) -> float:
        return self.seconds_per_case * self.train_cases / 60


def training_cost(backbone, cases: Split, train_cases: int, warmup: int = WARMUP) -> TrainingCost:
    """Time ``TrainingCost``'s step on each of ``cases`` (after ``warmup`` untimed ones), in the backbone's compute
    dtype, and scale it to an epoch of ``train_cases``. The backbone's weights stay as they are."""
    tokenizer, embed = backbone.tokenizer, backbone.model.get_input_embeddings()
    examples = []
    for case in cases:
        prompt = tokenizer(json_prompt(backbone, case), add_special_tokens=False)["input_ids"]
        reply = tokenizer(gold_reply(case), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([prompt + reply], device=backbone.device)
        examples.append((ids, torch.where(torch.arange(ids.shape[1], device=ids.device) < len(prompt), -100, ids)))

    def step(example: tuple[torch.Tensor, torch.Tensor]) -> None:
        ids, labels = example
        with torch.inference_mode(False), torch.enable_grad():
            with backbone.precision.autocast():
                inputs = embed(ids).detach().requires_grad_(True)
                loss = backbone.model(inputs_embeds=inputs, labels=labels).loss
            loss.backward()

    with ComputeDtype(backbone) as seen:
        timing = time_calls("teacher-forced forward + backward", step, examples, warmup, backbone.device)
    return TrainingCost(timing.median / 1e3, float(np.median([ids.shape[1] for ids, _ in examples])), len(cases),
                        train_cases, seen.dtype)
