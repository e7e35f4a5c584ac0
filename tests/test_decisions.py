"""The one loader for a user's decisions (``data/decisions.py``): every source kind, JSON and text states, hard and
soft labels, questions from a schema or per row, splits given or carved, and every bad input refused with a message
that names the row and the field."""

import csv
import json

import numpy as np
import pandas as pd
import pytest

from decisionkit.core import settings
from decisionkit.data.cases import DataError, load_typed_decisions
from decisionkit.data.decisions import (
    MIN_TRAIN_PER_WORKFLOW,
    held_out_validation_rows,
    load_decisions,
)
from decisionkit.data.labels import load_schema, load_schemas
from decisionkit.data.scenarios import load_scenario
from decisionkit.data.states import content_id

SCHEMA = {
    "approve": {"type": "noul", "instructions": "Reimburse the claim as filed?"},
    "route": {"type": "choice", "instructions": "Who acts on it?",
              "criteria": {"auto": "nothing to check", "manager": "a manager looks", "audit": "an auditor looks"}},
    "risk": {"type": "score", "instructions": "How risky is it?", "criteria": ["low", "some", "high", "severe"]},
}
LABELS = ("approve", "route", "risk")


def claim(i: int) -> dict:
    """A row as a user's export holds it: an id, a JSON state with fields and a note, and one hard label a question
    (the labels follow the amount, so a model could learn them)."""
    amount = 20 + 13 * i
    risk = min(3, amount // 150)
    return {"id": f"c{i}", "state": {"amount_usd": amount, "receipt": i % 3 != 0, "note": f"dinner number {i}"},
            "approve": "true" if risk < 2 else "false", "route": ("auto", "manager", "audit", "audit")[risk],
            "risk": risk}


ROWS = [claim(i) for i in range(60)]


def write_csv(path, rows, columns=("id", "state", *LABELS)):
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for r in rows:
            writer.writerow([json.dumps(r[c]) if isinstance(r.get(c), dict) else r.get(c, "") for c in columns])
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def same(a, b):
    """Two loads that read the same cases: ids, states, gold, and the record's hash of the rows."""
    for split in ("train", "validation", "test"):
        assert a[split].ids == b[split].ids, split
        for x, y in zip(a[split], b[split]):
            assert x.state == y.state and x.workflow == y.workflow
            assert all(np.array_equal(x.gold[q].probabilities, y.gold[q].probabilities) for q in x.gold)
    assert a.record["rows sha256"] == b.record["rows sha256"]


def test_every_source_kind_reads_the_same_cases(tmp_path):
    from datasets import Dataset

    csv_path = write_csv(tmp_path / "claims.csv", ROWS)
    reference = load_decisions(csv_path, SCHEMA)
    write_jsonl(tmp_path / "claims.jsonl", ROWS)
    (tmp_path / "claims.json").write_text(json.dumps(ROWS))
    frame = pd.DataFrame([{**r, "state": json.dumps(r["state"])} for r in ROWS])
    frame.to_parquet(tmp_path / "claims.parquet")
    folder = tmp_path / "claims"
    folder.mkdir()
    (folder / "schema.json").write_text(json.dumps(SCHEMA))
    write_csv(folder / "export.csv", ROWS)
    for source in (tmp_path / "claims.jsonl", tmp_path / "claims.json", tmp_path / "claims.parquet", folder):
        same(load_decisions(source, SCHEMA if source != folder else None), reference)
    for source in (frame, ROWS, Dataset.from_pandas(frame)):
        same(load_decisions(source, SCHEMA), reference)
    # the workflow is 'decisions' unless named: never the file's name, so a renamed export reads the same
    assert reference.schema == {"decisions": load_schema(SCHEMA)}
    same(load_decisions(csv_path.rename(tmp_path / "next_month.csv"), SCHEMA), reference)
    assert load_decisions(tmp_path / "next_month.csv", SCHEMA, workflow="claims").schema.keys() == {"claims"}
    assert reference.record["states"] == {"json": 60, "text": 0, "numbers read from strings": 0,
                                          "numbers missing (NaN)": 0}  # the CSV cells were read as JSON objects
    assert load_decisions(frame, SCHEMA).record["source"] == "in memory (DataFrame)"
    assert load_decisions(ROWS, SCHEMA)["train"].workflows == ["decisions"]  # in memory, no name given


def test_no_split_column_carves_validation_and_test_by_workflow_and_seed(tmp_path):
    rows = ROWS + [{**claim(i), "id": f"t{i}", "workflow": "travel"} for i in range(40)]
    data = load_decisions(rows, SCHEMA, workflow="meals")
    table = data.table()
    for workflow, n in (("meals", 60), ("travel", 40)):  # test: about a fifth, row by row; validation: a tenth of the rest
        test = table.loc[workflow, "test"]
        assert 0.1 * n <= test <= 0.3 * n
        assert table.loc[workflow, "validation"] == held_out_validation_rows(n - test)
        assert table.loc[workflow].sum() == n
    assert "test: each row held out with chance 20%" in data.record["split rule"] and "test" in data.summary()
    again = load_decisions(list(reversed(rows)), SCHEMA, workflow="meals")  # the order of the rows does not matter
    assert set(again["test"].ids) == set(data["test"].ids) and set(again["validation"].ids) == set(data["validation"].ids)
    fewer = load_decisions(rows[::2], SCHEMA, workflow="meals", min_train=0)  # a filtered export: test stays test
    assert set(fewer["test"].ids) == set(data["test"].ids) & set(fewer.rows.ids)
    other = load_decisions(rows, SCHEMA, workflow="meals", seed=7)
    assert set(other["test"].ids) != set(data["test"].ids)
    ids = [set(data[s].ids) for s in ("train", "validation", "test")]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2]) and sum(map(len, ids)) == 100


def test_splits_given_are_kept_and_the_benchmark_layout_reads_as_the_benchmark(tmp_path):
    given = [{**r, "split": ("train", "validation", "test")[i % 3] if i < 9 else "train"} for i, r in enumerate(ROWS)]
    data = load_decisions(given, SCHEMA)
    assert [len(data[s]) for s in ("train", "validation", "test")] == [54, 3, 3]
    assert data.record["split rule"] == "as the data gives them"
    only_train = load_decisions([{**r, "split": "train"} for r in ROWS], SCHEMA)  # test and validation carved
    assert set(only_train["test"].ids) == set(load_decisions(ROWS, SCHEMA)["test"].ids)  # the same rule
    benchmark = load_decisions(settings.data_dir())
    for split in ("train", "validation", "test"):  # the benchmark's own validation rule: the same 80 cases
        assert benchmark[split].ids == load_typed_decisions(split).ids
    assert benchmark.benchmark and not data.benchmark


def test_benchmark_layout_with_a_new_workflow_is_read_as_a_users_data(tmp_path, splits):
    invoices = [c for c in splits["train"] if c.workflow == "invoice_processing"][:60]
    new = [{**c.to_json(), "id": f"x{i}", "workflow": "refunds"} for i, c in enumerate(invoices)]
    write_jsonl(tmp_path / "train.jsonl", new[:45])
    write_jsonl(tmp_path / "test.jsonl", new[45:])
    data = load_decisions(tmp_path)
    assert list(data.schema) == ["refunds"] and data.schema["refunds"] == invoices[0].questions
    assert len(data["test"]) == 15 and len(data["validation"]) == held_out_validation_rows(45) and not data.benchmark
    by_id = {c.id: c for c in data.rows}
    for i, case in enumerate(invoices):  # Case.to_json and the loader round-trip: states, gold and labels as they were
        back = by_id[f"x{i}"]
        assert back.state == case.state and isinstance(back.state, dict)
        assert all(np.array_equal(back.gold[q].probabilities, g.probabilities) and back.gold[q].label == g.label
                   for q, g in case.gold.items())


def test_labels_hard_and_soft_in_every_form():
    rows = [{"state": "a", "approve": True, "route": "audit", "risk": 2},
            {"state": "b", "approve": "FALSE", "route": {"auto": 0.6, "manager": 0.4}, "risk": "3"},
            {"state": "c", "approve": 1, "route": '{"manager": 1.0}', "risk": 1.0},
            {"state": "d", "approve": "0", "route": "auto", "risk": {"0": 0.5, "1": 0.5}},
            {"state": "e", "labels": {"approve": {"true": 0.7, "false": 0.3}, "route": "manager", "risk": 0}}]
    cases = load_decisions(rows, SCHEMA, min_train=0, carve=False).rows
    gold = [{q: c.gold[q].probabilities.tolist() for q in LABELS} for c in cases]
    assert gold[0] == {"approve": [0, 1], "route": [0, 0, 1], "risk": [0, 0, 1, 0]}
    assert gold[1] == {"approve": [1, 0], "route": [0.6, 0.4, 0], "risk": [0, 0, 0, 1]}
    assert gold[2] == {"approve": [0, 1], "route": [0, 1, 0], "risk": [0, 1, 0, 0]}
    assert gold[3]["approve"] == [1, 0] and gold[3]["risk"] == [0.5, 0.5, 0, 0]
    assert gold[4]["approve"] == [0.3, 0.7] and cases[4].gold["approve"].label == "true"
    assert [c.id for c in cases] == [content_id(c.state) for c in cases]  # no id: a hash of the state
    assert all(isinstance(c.state, str) for c in cases)  # text states: the language model reads them alone


def test_questions_per_row_or_for_several_workflows():
    q = {"ok": {"type": "noul"}}
    per_row = load_decisions([{"state": "x", "questions": q, "ok": "true"}], min_train=0, carve=False)
    assert list(per_row.schema["decisions"]) == ["ok"]
    several = load_schemas({"meals": SCHEMA, "travel": q})
    assert set(several) == {"meals", "travel"} and list(several["travel"]) == ["ok"]
    data = load_decisions([{"workflow": "travel", "state": "x", "ok": 0}, {"workflow": "meals", **claim(1)}],
                          {"meals": SCHEMA, "travel": q}, min_train=0, carve=False)
    assert set(data.schema) == {"meals", "travel"}


def test_a_score_level_is_read_by_its_number_or_its_text():
    rows = [{"state": "x", "approve": 1, "route": "auto", "risk": risk}
            for risk in (2, "2", "high", " High ", '{"some": 0.25, "high": 0.75}')]
    cases = load_decisions(rows, SCHEMA, min_train=0, carve=False).rows
    assert [c.gold["risk"].label for c in cases] == ["2"] * 5
    assert cases[4].gold["risk"].probabilities.tolist() == [0.0, 0.25, 0.75, 0.0]


def bad_csv(tmp_path, text):
    path = tmp_path / "claims.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize("rows, message", [
    ([{"id": "a", "state": "x", "approve": "maybe", "route": "auto", "risk": 0}],
     r"row 1: field 'approve' is 'maybe'; expected one of \['false', 'true'\] \(or yes/no, y/n, true/false, 1/0"),
    ([{"id": "a", "state": "x", "approve": "true", "route": "sales", "risk": 0}],
     r"row 1: field 'route' is 'sales'; expected one of \['auto', 'manager', 'audit'\]"),
    ([{"id": "a", "state": "x", "approve": "true", "route": "auto", "risk": 4}], r"field 'risk' is 4; expected one of"),
    ([{"id": "a", "state": "x", "approve": "true", "route": "auto", "risk": "extreme"}],
     r"field 'risk' is 'extreme'; expected one of \['0', '1', '2', '3'\] \(a level's number or its text: 0 = 'low', "
     r"1 = 'some', 2 = 'high', 3 = 'severe'\)"),
    ([{"id": "a", "state": "x", "approve": "true", "route": {"auto": 0.5, "manager": 0.2}, "risk": 0}],
     "row 1: field 'route' sums to 0.700000; expected 1"),
    ([{"id": "a", "state": "x", "approve": "true", "route": "auto"}],
     "row 1: field 'risk' is missing; every row needs a label for question 'risk'"),
    ([{"id": "a", "state": 42, "approve": "true", "route": "auto", "risk": 0}],
     "row 1: field 'state' is int 42; expected a JSON object or text"),
    ([{"id": "a", "state": ["x"], "approve": "true", "route": "auto", "risk": 0}], "field 'state' is list"),
    ([{"id": "a", "approve": "true", "route": "auto", "risk": 0}], "row 1: the row has no state"),
    ([{"id": "a", "state": "x", "approve": "true", "route": "auto", "risk": 0, "urgent": "true"}],
     "row 1: column 'urgent' is none of the id .* --ignore-columns urgent leaves it out"),
    ([{"id": "a", "state": "x", "approve": "true", "route": "auto", "risk": 0}] * 2,
     r"row 2: field 'id' 'a' is used twice \(first at row 1\)"),
    ([{"id": "a", "state": "x", "split": "dev", "approve": "true", "route": "auto", "risk": 0}],
     "row 1: field 'split' is 'dev'; expected one of train, validation, test"),
    ([], "no rows; expected one case a row"),
])
def test_bad_rows_name_the_row_and_the_field(rows, message):
    with pytest.raises(DataError, match=message):
        load_decisions(rows, SCHEMA, min_train=0)


def test_bad_files_and_too_few_rows_are_refused_before_training(tmp_path):
    with pytest.raises(DataError, match=r"claims.csv: no rows"):
        load_decisions(bad_csv(tmp_path, "id,state,approve,route,risk\n"), SCHEMA)
    with pytest.raises(DataError, match=r"claims.csv: no rows"):
        load_decisions(bad_csv(tmp_path, ""), SCHEMA)
    with pytest.raises(DataError, match=r"claims.csv:2: not UTF-8 text \(byte 0xff\); save the file as UTF-8"):
        load_decisions(bad_csv(tmp_path, b"id,state\n\xff\xfe\x00garbage\n"), SCHEMA)
    with pytest.raises(DataError, match=r"claims.csv:2: the row has 6 cells; the header has 5 columns"):
        load_decisions(bad_csv(tmp_path, 'id,state,approve,route,risk\na,{"x": 1},true,auto,0,extra\n'), SCHEMA)
    with pytest.raises(DataError, match=r"claims.jsonl:2: not valid JSON"):
        (tmp_path / "claims.jsonl").write_text('{"state": "x"}\n{oops\n')
        load_decisions(tmp_path / "claims.jsonl", SCHEMA)
    with pytest.raises(DataError, match="no questions: give a schema"):
        load_decisions(ROWS[:3], min_train=0)
    with pytest.raises(DataError, match=rf"workflow 'decisions' has \d+ train rows \(25 in all\); at least "
                                        rf"{MIN_TRAIN_PER_WORKFLOW} are needed .* give it 29 rows or more"):
        load_decisions(write_csv(tmp_path / "claims.csv", ROWS[:25]), SCHEMA)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_decisions(tmp_path / "nowhere.csv", SCHEMA)
    with pytest.raises(DataError, match=r"a \.txt is not read"):
        (tmp_path / "claims.txt").write_text("x")
        load_decisions(tmp_path / "claims.txt", SCHEMA)


def test_schema_shapes_and_errors(tmp_path):
    with pytest.raises(DataError, match="score question must list its levels"):
        load_schema({"s": {"type": "score", "criteria": ["only one"]}})
    path = tmp_path / "schema.json"
    path.write_text('{"team": {"type": "choice", "criteria": {"billing": "a", "billing": "b"}}}')
    with pytest.raises(DataError, match=r"duplicate keys \['billing'\]"):
        load_schema(path)
    with pytest.raises(DataError, match="field 'team' is neither a question"):
        load_schemas({"team": "billing"})
    path.write_text("{not json")
    with pytest.raises(DataError, match="schema.json: not valid JSON"):
        load_schemas(path)


def test_scenarios_read_through_the_same_loader():
    tickets = load_scenario("tickets", "test")
    assert tickets.workflows == ["tickets"] and isinstance(tickets[0].state, str) and len(tickets) == 92
    other = load_scenario("tickets", "other-voice")
    assert other.name == "other-voice" and len(other) == 40
