import json

import numpy as np
import pytest

from decisionkit.data.cases import DataError
from decisionkit.data.decisions import load_decisions
from decisionkit.data.scenarios import DATA_DIR, load_scenario, load_schema
from decisionkit.training.trainer import preset, split_uses, training_splits

SCHEMA = {
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "tech": "bugs"}},
    "urgent": {"type": "noul", "instructions": "The ticket is urgent."},
    "severity": {"type": "score", "instructions": "How bad?", "criteria": ["none", "some", "a lot"]},
}


def write(tmp_path, rows, name="examples.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    return path


def row(i, split="train", text="my card was charged twice", **labels):
    return {"id": f"e{i}", "split": split, "text": text,
            "labels": {"team": "billing", "urgent": "true", "severity": "2", **labels}}


def test_project_scenarios_load_with_fixed_splits():
    sizes = {name: {s: len(load_scenario(name, s)) for s in ("train", "validation", "test")}
             for name in ("tickets", "ngs-qc")}
    assert sizes == {"tickets": {"train": 325, "validation": 46, "test": 92},
                     "ngs-qc": {"train": 196, "validation": 28, "test": 56}}
    tickets = load_scenario("tickets", "test")
    assert set(tickets[0].questions) == {"team", "priority", "sentiment", "contains_pii", "language"}
    assert tickets.workflows == ["tickets"] and isinstance(tickets[0].state, str)
    assert any("charged twice" in c.state for c in tickets)  # the seed example is in test
    soft = [c for c in load_scenario("ngs-qc", "train") for g in c.gold.values() if 0 < g.probabilities.max() < 1]
    assert soft  # ambiguous reports carry distributions


def test_csv_examples_with_text_and_a_distribution_in_a_cell(tmp_path):
    """A scenario folder's CSV (the loader's own tests are in test_decisions.py)."""
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "examples.csv").write_text('id,split,text,team,urgent,severity\n'
                                           'a,train,refund please,billing,true,1\n'
                                           'b,train,"app crashes, help","{""tech"": 0.9, ""billing"": 0.1}",false,2\n')
    cases = load_decisions(tmp_path, min_train=0, carve=False).rows  # the folder's rows, none held out
    assert [c.gold["team"].label for c in cases] == ["billing", "tech"] and cases.workflows == ["decisions"]
    assert cases[1].gold["team"].probabilities.tolist() == [0.1, 0.9] and cases[1].state == "app crashes, help"


def test_scenario_presets_keep_dev_and_validation_apart():
    table = split_uses("tickets")
    assert table["cases"].to_dict() == {"train": 325, "dev (a slice of train)": 65, "validation": 46, "test": 92}
    assert table.loc["dev (a slice of train)", "used for"] == "picks L2 and steps"
    assert "picks" not in table.loc["validation", "used for"]
    for name in ("tickets", "ngs-qc"):
        _, dev, validation = training_splits(preset(name))
        assert set(dev.ids) <= set(load_scenario(name, "train").ids) and not set(dev.ids) & set(validation.ids)
    alone = split_uses(preset("ngs-qc", dev_per_workflow=0))  # no dev slice: validation picks and calibrates
    assert list(alone.index) == ["train", "validation", "test"]
    assert alone.loc["validation", "used for"].startswith("picks L2 and steps")


def test_other_voice_tickets_are_a_scored_only_split_of_their_own():
    other = load_scenario("tickets", "other-voice")
    schema = load_schema(DATA_DIR / "tickets" / "schema.json")
    assert len(other) == 40 and other.name == "other-voice" and other.workflows == ["tickets"]
    assert set(schema) == {"team", "priority", "sentiment", "contains_pii", "language"}
    for case in other:
        assert set(case.gold) == set(case.questions) == set(schema)
        for q, gold in case.gold.items():
            p = gold.probabilities
            assert p.shape == (len(schema[q].options),) and (p >= 0).all() and p.sum() == pytest.approx(1)
            assert gold.label == schema[q].options[int(np.argmax(p))]
    assert any(0 < g.probabilities.max() < 1 for c in other for g in c.gold.values())  # soft labels, as in the set
    main = [json.loads(line) for line in (DATA_DIR / "tickets" / "tickets.jsonl").read_text(encoding="utf-8").split("\n")
            if line.strip()]

    def normalised(text):
        return " ".join(text.lower().split())

    assert all(isinstance(c.state, str) for c in other)  # the ticket as written (c.text adds the workflow line)
    assert not {normalised(c.state) for c in other} & {normalised(r["text"]) for r in main}  # no text shared
    assert not set(other.ids) & {r["id"] for r in main}
    for split in training_splits(preset("tickets")):  # the trainer never reads it
        assert not set(split.ids) & set(other.ids)


def test_a_scored_only_split_keeps_to_its_own_file(tmp_path):
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    write(tmp_path, [row(1), row(2, split="test")])
    with pytest.raises(FileNotFoundError, match="has no other_voice.jsonl"):
        load_scenario(tmp_path, "other-voice")
    write(tmp_path, [row(3, split="other-voice"), row(4, split="test")], name="other_voice.jsonl")
    assert load_scenario(tmp_path, "train").ids == ["e1"]  # the scored-only file is not a second examples file
    with pytest.raises(DataError, match="other_voice.jsonl:2: field 'split' is 'test'; expected one of other-voice"):
        load_scenario(tmp_path, "other-voice")
    write(tmp_path, [row(1), row(2, split="other-voice")])
    with pytest.raises(DataError, match="examples.jsonl:2: field 'split' is 'other-voice'; expected one of train"):
        load_scenario(tmp_path, "train")
