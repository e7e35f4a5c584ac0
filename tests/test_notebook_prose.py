"""Every number a notebook's prose states comes from that notebook's own run, or says where it comes from.

Read as a learner reads them, the saved notebooks must not say one thing in a markdown cell and show another in
their outputs. For each notebook, every *measured-looking* number of its markdown cells must be one of:

1. **in its saved outputs**: the ``text/plain``, ``text/markdown`` and ``text/html`` (tags stripped) of its code
   cells' results, and their ``stdout`` streams;
2. **a setting its code states**: a numeric literal of an assignment to an upper-case name in one of its code
   cells (``LORA_RANK = 16``, ``BUDGETS = (64, 256)``, ``REJECTION = 0.05``), comments and strings excluded; other
   literals (a toy example's data, a call's arguments) do not count;
3. **a quoted reference**, marked as one: the sentence holding the number names its source (the reference run,
   a model card, the benchmark's leaderboard, another notebook) and carries the visible marker
   ``<sup>quoted</sup>``, anywhere in the sentence up to and right after its full stop, e.g.
   ``The reference run reported 175 ms for one question.<sup>quoted</sup>``. The marker covers every number of
   its sentence (a sentence ends at ``.``, ``!`` or ``?`` followed by a space, at a line break that starts a list
   item or a table row, and at a blank line).

What counts as a measured-looking number (the rest is not checked):

- a decimal (``0.72``, ``8.15``, ``1e-5``), or
- a number followed by a unit: ``%``, ``x`` or ``×`` (a ratio, written ``4.8x``), ``ms``, ``µs``, ``s``, ``min``,
  ``minutes``, ``h``, ``hours``, ``KB``, ``MB``, ``GB``, ``TB`` (and ``MiB``, ``GiB``), ``tokens``, ``characters``;
  the unit may follow a space or a hyphen (``300 characters``, ``a 300-token state``). In a range (``10-30%``,
  ``3-5x``, ``from 124 to 26 ms``) the unit covers both ends.

Not numbers here: integers without a unit (a notebook's number ``03``, headings and list ordinals ``1.``, counts
such as ``80 cases`` or ``layer 15``, years), numbers inside a word or a name (``float32``, ``Qwen3.5-4B``,
``r16``, ``SmolLM2-135M``), versions (``0.1.2``), number words (``one``, ``five``), and everything in code spans,
code blocks, HTML comments, link targets and URLs. Two parts of a notebook are not claims about its run and are
skipped: the title cell's ``**Runtime ...**`` paragraph (wall time of the notebook as a whole, which no cell
prints) and the ``## Exercises`` section (tasks with settings for the learner to try, not results).

How a stated number matches a found one, value against value (the unit is not compared):

- **at the precision the prose states**: ``0.72`` matches any found value that rounds to 0.72 (``0.720``,
  ``0.7249``, ``0.7150``: a tie may round either way); ``124 ms`` matches ``123.996``; a stated number more
  precise than the found one matches only when its extra digits are zeros (``0.720`` matches ``0.72``, ``0.721``
  does not);
- **percent and fraction forms both**: ``72%`` matches ``0.72`` (and ``0.720`` matches ``72.0%``), at the
  precision the prose states in its own form (``72.0%`` is 0.720 to three places);
- signs are ignored (``-0.004`` and ``0.004`` are the same number; a range's hyphen is no minus).

So the check proves that the value is on the page, not that the sentence describes the right cell: a number that
matches only by accident still needs a reader's eye. It reads the notebooks' JSON only (no kernel) and takes well
under a second for all ten.
"""

from __future__ import annotations

import html
import io
import json
import re
import tokenize
from dataclasses import dataclass
from decimal import ROUND_HALF_DOWN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MARKER = "<sup>quoted</sup>"
_QUOTED = "\u27e6quoted\u27e7"  # the marker once the markdown is reduced to text
OUTPUT_TYPES = ("text/plain", "text/markdown", "text/html")
MAX_PLACES = 12  # rounding to more places than this is compared exactly

_NUMBER = (r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"  # 1,200 or 1200 or 0.72
           r"(?P<exp>[eE][-+]?\d+)?")
_UNIT = (r"(?P<unit>\s?%|\s?×|x\b"
         r"|[ \u00a0-]?(?:ms|µs|μs|s|sec|seconds?|min|minutes?|h|hours?|KB|kB|MB|MiB|GB|GiB|TB"
         r"|tokens?|characters?|chars)\b)?")
# In prose: not inside a word, a name or a version (Qwen3.5-4B, float32, 0.1.2), and not a fragment of a longer
# number.
PROSE_NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z]-)(?<![A-Za-z]\d-)" + _NUMBER + r"(?![.,]?\d)(?!\.\w)" + _UNIT)
RANGE_JOIN = re.compile(r"\s?(?:-|–|to)\s?")
# In outputs: every number, wherever it stands (a table cell, "~0.8B", "2.0x", "72.0%").
FOUND_NUMBER = re.compile(r"(?<![\d.])" + _NUMBER + r"(?P<pct>\s?%)?")


@dataclass(frozen=True)
class Stated:
    text: str  # as written, with its unit
    value: Decimal  # absolute value, in the form written (72 for 72%)
    places: int  # decimal places as written (negative never; 1e-5 has 5)
    percent: bool
    quoted: bool
    context: str  # the sentence around it


def to_decimal(num: str, exp: str | None) -> tuple[Decimal, int]:
    """A written number and the decimal places it is written to (``1.5e-3``: 4)."""
    digits = num.replace(",", "")
    places = len(digits.split(".")[1]) if "." in digits else 0
    value = Decimal(digits + (exp or ""))
    if exp:
        places -= int(exp[1:])
    return abs(value), places


def prose_text(source: str, first_cell: bool) -> str:
    """A markdown cell reduced to the text whose numbers are checked."""
    text = source.replace(MARKER, _QUOTED)
    text = re.sub(r"(```|~~~).*?\1", " ", text, flags=re.S)  # code blocks
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " ", text)  # code spans
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"https?://\S+", " ", text)
    text = re.sub(r"<[^>\n]+>", " ", text)  # other HTML tags
    text = html.unescape(text)
    heading = re.search(r"^(#{1,6})\s+Exercises\b.*$", text, flags=re.M | re.I)
    if heading:  # up to the next heading of the same or a higher level
        level = len(heading.group(1))
        after = re.search(rf"^#{{1,{level}}}\s", text[heading.end():], flags=re.M)
        text = text[:heading.start()] + (text[heading.end() + after.start():] if after else "")
    if first_cell:
        text = "\n\n".join(p for p in re.split(r"\n\s*\n", text) if not p.lstrip().startswith("**Runtime"))
    return text


def sentences(text: str) -> list[str]:
    """Sentences, list items, table rows and paragraphs: the scope of a quoted marker."""
    parts = re.split(r"\n\s*\n|\n(?=\s*(?:[-*+]|\d+\.)\s)|\n(?=\s*\|)|(?<=[.!?])\s+", text)
    return [p for p in parts if p and p.strip()]


def stated_numbers(source: str, first_cell: bool = False) -> list[Stated]:
    """The measured-looking numbers of one markdown cell (see the module's docstring)."""
    out = []
    for sentence in sentences(prose_text(source, first_cell)):
        quoted = _QUOTED in sentence
        matches = list(PROSE_NUMBER.finditer(sentence))
        units = [m.group("unit") for m in matches]
        for i in range(len(matches) - 1, -1, -1):  # a range's unit covers its first end
            nxt = i + 1
            if not units[i] and nxt < len(matches) and units[nxt]:
                gap = sentence[matches[i].end():matches[nxt].start()]
                if RANGE_JOIN.fullmatch(gap):
                    units[i] = units[nxt]
        for match, unit in zip(matches, units):
            value, places = to_decimal(match.group("num"), match.group("exp"))
            if places == 0 and not unit and not match.group("exp"):
                continue  # an integer without a unit: a count, an ordinal, a name
            context = " ".join(sentence.replace(_QUOTED, MARKER).split())
            out.append(Stated(match.group(0).strip(), value, places, bool(unit and "%" in unit), quoted, context))
    return out


class Found:
    """The numbers a notebook shows (outputs) or sets (code literals), as fractions and as percents."""

    def __init__(self, numbers: list[tuple[Decimal, int, bool]]):
        # (value, places, written as a percent) -> both forms, each with its places
        self.forms = {False: [], True: []}
        for value, places, pct in numbers:
            if pct:
                self.forms[True].append((value, places))
                self.forms[False].append((value / 100, places + 2))
            else:
                self.forms[False].append((value, places))
                self.forms[True].append((value * 100, places - 2))
        self._rounded: dict[tuple[bool, int], set[Decimal]] = {}
        self._exact = {pct: {v.normalize() for v, _ in values} for pct, values in self.forms.items()}

    def rounded(self, percent: bool, places: int) -> set[Decimal]:
        key = (percent, places)
        if key not in self._rounded:
            quantum = Decimal(1).scaleb(-places)
            got = set()
            for value, known in self.forms[percent]:
                if known >= places:
                    for mode in (ROUND_HALF_UP, ROUND_HALF_DOWN):
                        try:
                            got.add(value.quantize(quantum, rounding=mode))
                        except InvalidOperation:  # too many digits for the context: compared exactly below
                            pass
            self._rounded[key] = got
        return self._rounded[key]

    def has(self, stated: Stated) -> bool:
        if stated.value.normalize() in self._exact[stated.percent]:
            return True
        if stated.places > MAX_PLACES:
            return False
        quantum = Decimal(1).scaleb(-stated.places)
        return stated.value.quantize(quantum) in self.rounded(stated.percent, stated.places)


def output_text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            if output.get("name") == "stdout":
                parts.append(_joined(output.get("text", "")))
        else:
            data = output.get("data", {})
            for kind in OUTPUT_TYPES:
                if kind in data:
                    text = _joined(data[kind])
                    if kind == "text/html":
                        text = html.unescape(re.sub(r"<[^>]+>", " ", text))
                    parts.append(text)
    return "\n".join(parts)


def code_literals(source: str) -> list[tuple[Decimal, int, bool]]:
    """Numeric literals of a code cell's assignments to upper-case names (``SEED = 3407``, ``A, B = 1, 2.5``),
    comments and strings excluded; a cell that does not tokenize gives none."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]  # magics
    out, line = [], []
    try:
        for token in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
            if token.type not in (tokenize.NEWLINE, tokenize.ENDMARKER):
                if token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                    line.append(token)
                continue
            if _sets_constants(line):
                out += [v for t in line if t.type == tokenize.NUMBER for v in [_literal(t.string)] if v]
            line = []
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def _sets_constants(line: list[tokenize.TokenInfo]) -> bool:
    """True for a logical line ``NAME [, NAME ...] = ...`` whose names are all upper case."""
    equals = next((i for i, t in enumerate(line) if t.type == tokenize.OP and t.string == "="), None)
    if not equals:
        return False
    names = [t for t in line[:equals] if not (t.type == tokenize.OP and t.string == ",")]
    return all(t.type == tokenize.NAME and t.string.isupper() for t in names)


def _literal(text: str) -> tuple[Decimal, int, bool] | None:
    text = text.replace("_", "").lower()
    if text.endswith("j") or text.startswith(("0x", "0o", "0b")):
        return None
    num, _, exp = text.partition("e")
    num = "0" + num if num.startswith(".") else num.rstrip(".")
    value, places = to_decimal(num, "e" + exp if exp else None)
    return value, places, False


def _joined(text) -> str:
    return "".join(text) if isinstance(text, list) else text


def found_numbers(notebook: dict) -> Found:
    numbers = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        for match in FOUND_NUMBER.finditer(output_text(cell)):
            value, places = to_decimal(match.group("num"), match.group("exp"))
            numbers.append((value, places, bool(match.group("pct"))))
        numbers += code_literals(_joined(cell["source"]))
    return Found(numbers)


def unsupported(notebook: dict) -> list[str]:
    """Every measured-looking number of the notebook's markdown that neither its outputs nor its code hold and
    that is not marked as quoted: one line each, with the cell and the sentence."""
    found = found_numbers(notebook)
    problems = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for stated in stated_numbers(_joined(cell["source"]), first_cell=index == 0):
            if not stated.quoted and not found.has(stated):
                problems.append(f"cell {index}: {stated.text!r} in: {stated.context[:200]}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_number_in_prose_is_shown_set_or_quoted(path):
    problems = unsupported(json.loads(path.read_text(encoding="utf-8")))
    assert not problems, (f"{path.name}: numbers the prose states that no output shows, no code cell sets and no "
                          f"{MARKER} marks (see this test's docstring):\n" + "\n".join(problems))


def test_there_are_notebooks_to_check():
    assert len(NOTEBOOKS) == 12  # 00-09, the solutions (10) and 11


# The rule itself, on small cells.

def _notebook(markdown: list[str], stdout: str = "", code: str = "") -> dict:
    return {"cells": [{"cell_type": "markdown", "source": text} for text in markdown]
            + [{"cell_type": "code", "source": code,
                "outputs": [{"output_type": "stream", "name": "stdout", "text": stdout}]}]}


def test_what_counts_as_a_number():
    texts = [s.text for s in stated_numbers(
        "## 3. Pooling\n\nNotebook 03 uses five heads on 80 cases, layer 15 of SmolLM2-135M, float32, Qwen3.5-4B "
        "and `LORA_RANK = 0.5` (version 0.1.2, see [here](http://x.org/1.5)). Accuracy 0.720, 72.0% of cases, "
        "124 ms, 4.8x, 1e-5, 300 characters, a 250-token state, 3-5x and from 124 to 26 ms.<!-- 9.9 -->")]
    assert texts == ["0.720", "72.0%", "124 ms", "4.8x", "1e-5", "300 characters", "250-token", "3", "5x",
                     "124", "26 ms"]


def test_matching_at_the_stated_precision_in_either_form():
    notebook = _notebook(["Accuracy 0.72, 0.720, 72%, 72.0%, 0.7, 124 ms and 1.38x."],
                         stdout="accuracy 0.7205; encoding 123.996 ms; 1.38x")
    assert unsupported(notebook) == []
    wrong = _notebook(["Accuracy 0.721 and 0.7210, but 0.7200 and 73%."], stdout="accuracy 0.72")
    assert [p.split("'")[1] for p in unsupported(wrong)] == ["0.721", "0.7210", "73%"]


def test_a_wrong_number_fails_and_code_constants_or_quoted_references_pass():
    notebook = _notebook(["Batching gains 10-30% here.", "The rejection is 0.5 (`REJECTION`), not 0.25 or 0.85.",
                          "The reference run reported 175 ms for one question.<sup>quoted</sup> Here 163 ms."],
                         stdout="speed-up 1.38x; 163.01 ms",
                         code="REJECTION = 0.5  # 0.25 in a comment\ntoy = [0.85]\nprint(f'{0.25}')")
    assert [p.split("'")[1] for p in unsupported(notebook)] == ["10", "30%", "0.25", "0.85"]


def test_runtime_paragraph_and_exercises_are_not_claims():
    notebook = _notebook(["# 01 · Title\n\n**Runtime on a laptop CPU:** about 15 minutes.\n\nIt measures 0.5 s.",
                          "## Summary\n\n- 0.9 s\n\n## Exercises\n\n1. Truncate to 128 tokens.\n\n## After\n\n2.5 s"])
    assert [p.split("'")[1] for p in unsupported(notebook)] == ["0.5 s", "0.9 s", "2.5 s"]
