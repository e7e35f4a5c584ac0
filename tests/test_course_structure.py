"""The course's shape, as a learner meets it: every numbered notebook names in its title cell the model it runs,
ends with 3-5 questions to check understanding, and notebook 10 answers each of them, in order.

Reads the notebooks' JSON only (no kernel)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = next(p for p in NOTEBOOKS if p.name.startswith("10_"))
QUESTIONS_HEADING = "## Check your understanding"
ANSWERS_HEADING = "## Check your understanding: answers"


def markdown_cells(notebook: Path) -> list[str]:
    return [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
            for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "markdown"]


def numbered(text: str) -> list[str]:
    """The items of the numbered list in ``text`` (1., 2., ...), each item's first line."""
    return re.findall(r"^\d+\.\s+(.+)$", text, flags=re.M)


def questions(notebook: Path) -> list[str]:
    cells = [c for c in markdown_cells(notebook) if c.startswith(QUESTIONS_HEADING + "\n")]
    assert len(cells) == 1, f"{notebook.name}: one '{QUESTIONS_HEADING}' cell, found {len(cells)}"
    return numbered(cells[0])


def answers(solutions: Path) -> dict[str, list[str]]:
    """Notebook number -> the answers notebook 10 gives to its questions, from the cells after the answers heading."""
    cells = markdown_cells(solutions)
    start = next(i for i, c in enumerate(cells) if c.startswith(ANSWERS_HEADING))
    found = {}
    for cell in cells[start + 1:]:
        heading = re.match(r"### (\d\d) · ", cell)
        if heading:
            found[heading.group(1)] = numbered(cell)
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_title_cell_names_the_model_it_runs(notebook):
    title = markdown_cells(notebook)[0]
    assert title.startswith("# "), f"{notebook.name}: the first cell is the title"
    assert re.search(r"^\*\*Model:\*\* \S", title, flags=re.M), f"{notebook.name}: no '**Model:**' line in the title"


@pytest.mark.parametrize("notebook", [p for p in NOTEBOOKS if p != SOLUTIONS], ids=lambda p: p.stem)
def test_each_notebook_ends_with_questions_that_notebook_10_answers(notebook):
    asked = questions(notebook)
    assert 3 <= len(asked) <= 5, f"{notebook.name}: {len(asked)} questions, expected 3 to 5"
    assert markdown_cells(notebook)[-1].startswith(QUESTIONS_HEADING), f"{notebook.name}: the questions come last"
    given = answers(SOLUTIONS).get(notebook.name[:2])
    assert given is not None, f"notebook 10 has no '### {notebook.name[:2]} · ...' answers"
    assert len(given) == len(asked), f"{notebook.name}: {len(asked)} questions, notebook 10 answers {len(given)}"


def test_the_checks_read_questions_and_answers(tmp_path):
    def notebook(name, *sources):
        path = tmp_path / name
        path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": s} for s in sources]}))
        return path

    asked = notebook("01_x.ipynb", "# 01 · X\n\n**Model:** one", QUESTIONS_HEADING + "\n\n1. Why?\n2. How?\n3. What?")
    solved = notebook("10_y.ipynb", "# 10", ANSWERS_HEADING, "### 01 · X\n\n1. A.\n2. B.\n   more of B\n3. C.")
    assert questions(asked) == ["Why?", "How?", "What?"]
    assert answers(solved) == {"01": ["A.", "B.", "C."]}
