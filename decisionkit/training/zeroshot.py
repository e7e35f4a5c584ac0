"""Zero-shot baseline: the backbone as it is, asked each question with its options listed as letters.

No generation: the prompt ends where the answer letter would come, and the next-token probabilities of the
option letters (renormalized over the letters) are the answer distribution. The state is encoded once per case
and its key/value cache is reused for each of the five questions (the
shared token prefix of the five prompts is computed once, so the result equals five separate forward passes).
"""

from __future__ import annotations

import string

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core import settings
from ..data.cases import Split
from ..data.questions import Question
from ..model.backbone import Backbone

SYSTEM = "You read a workflow state and answer one question about it with the letter of the best option."


def question_block(question: Question) -> str:
    """The question and its lettered options, as the prompt shows them."""
    lines = [f"Question: {question.instructions}" if question.type != "noul"
             else f"Is this statement true? {question.instructions}"]
    for letter, option, description in zip(string.ascii_uppercase, question.options, question.descriptions):
        label = f"level {option}" if question.type == "score" else option
        lines.append(f"{letter}. {label}" + (f": {description}" if description else ""))
    lines.append("Answer with one letter.")
    return "\n".join(lines)


def prompt(backbone: Backbone, case_text: str, question: Question) -> str:
    """The chat prompt for one question, ending where the answer letter comes."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{case_text}\n\n{question_block(question)}"}]
    text = backbone.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text + "Answer:"


def _common_prefix(sequences: list[list[int]]) -> int:
    n = min(len(s) for s in sequences) - 1  # keep at least one token per question to run
    for i in range(n):  # the chat template starts every prompt alike, so this is at least a few tokens
        if any(s[i] != sequences[0][i] for s in sequences):
            return i
    return n


def letter_ids(backbone: Backbone, count: int) -> list[int]:
    """Token id of each option letter as it follows "Answer:" (a space and the letter: one token)."""
    ids = [backbone.tokenizer.encode(f" {letter}", add_special_tokens=False) for letter in string.ascii_uppercase[:count]]
    if any(len(i) != 1 for i in ids):
        raise ValueError("this tokenizer splits option letters into several tokens; zero-shot scoring needs one")
    return [i[0] for i in ids]


@torch.inference_mode()
def zero_shot_predictions(backbone: Backbone, cases: Split, max_length: int = 512,
                          progress: bool = True) -> list[dict[str, np.ndarray]]:
    """Answer distributions per case and question from next-token letter probabilities."""
    model, tokenizer = backbone.model, backbone.tokenizer
    out = []
    for case in tqdm(cases, desc=f"zero-shot {cases.name}", disable=not progress or settings.progress_hidden()):
        questions = list(case.questions.values())
        state_ids = tokenizer(case.text, add_special_tokens=False, truncation=True, max_length=max_length)["input_ids"]
        text = tokenizer.decode(state_ids)  # the state truncated as the decision model sees it
        ids = [tokenizer(prompt(backbone, text, q), add_special_tokens=False)["input_ids"] for q in questions]
        shared = _common_prefix(ids)  # the system prompt and the state: encoded once, cached
        device = backbone.device
        cache = model(input_ids=torch.tensor([ids[0][:shared]], device=device), use_cache=True).cache
        answers = {}
        for question, sequence in zip(questions, ids):
            suffix = torch.tensor([sequence[shared:]], device=device)
            logits = model(input_ids=suffix, cache=cache, use_cache=True).logits[0, -1]
            cache.crop(-suffix.shape[1])  # drop this question's tokens: the next one reuses the state alone
            letters = logits[letter_ids(backbone, len(question.options))]
            answers[question.id] = torch.softmax(letters.float(), dim=-1).cpu().numpy().astype(np.float64)
        out.append(answers)
    return out
