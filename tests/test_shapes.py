"""Every shape an export comes in, read to the same rows: the shipped expenses scenario written as a flat table
(pandas' ``json_normalize``, one column a field), a European Excel export (``;``, decimal commas, a BOM), a TSV, a
gzipped JSONL, a parquet of the flat table, a CSV with pandas' index column, a ``.CSV``; each reads to the same
rows' hash and the same splits as the shipped CSV of JSON cells (``data/tables.py``, ``data/rows.py``,
``data/states.py``). Then the shapes that failed a user one at a time: extra columns and the flags that read them,
yes/no labels, a repr cell, an Excel-cut cell, numbers stored as strings, numpy scalars and NaN in a DataFrame's
states, a re-sorted or filtered export without ids, big cells, and where each refusal points."""

import csv
import gzip
import json

import numpy as np
import pandas as pd
import pytest

from decisionkit.data.decisions import load_decisions
from decisionkit.data.exports import SHAPES, write_shapes
from decisionkit.data.questions import DataError
from decisionkit.data.scenarios import DATA_DIR
from decisionkit.data.states import EXCEL_CELL_LIMIT, content_id
from decisionkit.data.tables import sniff_delimiter

EXPENSES = DATA_DIR / "expenses"
SCHEMA = EXPENSES / "schema.json"
SMALL = {
    "approve": {"type": "noul", "instructions": "Grant the access as asked?"},
    "level": {"type": "choice", "criteria": {"read": "read only", "write": "read and write", "admin": "everything"}},
}


@pytest.fixture(scope="module")
def shipped():
    return load_decisions(EXPENSES / "claims.csv", SCHEMA)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """The shipped claims in every shape an export tool writes (``data/exports.py``), and the shipped CSV itself with
    Excel's BOM and an upper-case name."""
    folder = tmp_path_factory.mktemp("shapes")
    files = write_shapes("expenses", folder)
    files["CLAIMS.CSV"] = folder / "CLAIMS.CSV"
    files["CLAIMS.CSV"].write_bytes(b"\xef\xbb\xbf" + (EXPENSES / "claims.csv").read_bytes())
    return files


@pytest.mark.parametrize("shape", [*SHAPES, "CLAIMS.CSV"])
def test_every_shape_of_the_expenses_export_reads_to_the_same_rows(shapes, shipped, shape):
    data = load_decisions(shapes[shape], SCHEMA)
    assert data.record["rows sha256"] == shipped.record["rows sha256"]
    for split in ("train", "validation", "test"):
        assert data[split].ids == shipped[split].ids, split
    by_id = {c.id: c.state for c in shipped.rows}
    first = data.rows[0]
    assert first.state["employee"]["level"] == by_id[first.id]["employee"]["level"]  # dotted columns nested again
    assert isinstance(first.state["receipt_attached"], bool) and isinstance(first.state["items"], list)
    assert data.record["states"]["json"] == 500
    expected = {"excel": ";", "tsv": "\t", "flat": ",", "indexed": ",", "CLAIMS.CSV": ","}.get(shape)
    assert data.record["delimiter"] == expected
    assert (data.record["index column"] is not None) == (shape == "indexed")
    if shape in ("flat", "indexed", "excel"):  # what pandas and Excel did to the numbers, undone
        assert "3.0" in shapes[shape].read_text(encoding="utf-8-sig") or shape == "excel"
        assert "499,83" in shapes[shape].read_text(encoding="utf-8-sig") or shape != "excel"


def test_the_delimiter_is_found_from_the_rows():
    assert sniff_delimiter('id;state;ok\n1;"{""a"": 1, ""b"": 2}";true\n') == ";"
    assert sniff_delimiter("id\tnote\n1\ta, b and c\n") == "\t"
    assert sniff_delimiter("id|note\n1|x\n") == "|"
    assert sniff_delimiter('id,state\n1,"a; b"\n') == ","
    assert sniff_delimiter("only\none\n") == ","


def access(i: int) -> dict:
    """An IT access request as a ticketing tool exports it: an id of its own, flat fields, a justification."""
    return {"request_id": f"REQ-{i:04d}", "team": ("sales", "eng", "finance")[i % 3], "seniority": str(i % 7),
            "system": ("crm", "warehouse", "payroll")[i % 3], "justification": f"need it for project {i}",
            "approve": ("yes", "no", "Y", "N", "TRUE", "false", "1", "0")[i % 8],
            "level": ("read", "write", "admin")[(i // 3) % 3], "exported_by": "admin", "export_date": "2026-12-01"}


def write_rows(path, rows, delimiter=","):
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_a_flat_export_with_its_own_id_and_columns_to_leave_out(tmp_path):
    rows = [access(i) for i in range(40)]
    path = write_rows(tmp_path / "requests.csv", rows)
    with pytest.raises(DataError, match=r"requests.csv:2: column 'request_id' is none of the id .* --id-column "
                                        r"request_id reads it as the row's id"):
        load_decisions(path, SMALL, state_columns=["team", "seniority"])
    data = load_decisions(path, SMALL, id_column="request_id", ignore_columns="exported_by,export_date")
    case = data.rows[0]
    assert case.id == "REQ-0000" and data.record["ids"] == "given"
    assert case.state == {"team": "sales", "seniority": 0, "system": "crm", "justification": "need it for project 0"}
    # yes/no labels in every case and form
    assert [c.gold["approve"].label for c in data.rows][:8] == ["true", "false", "true", "false", "true", "false",
                                                                "true", "false"]
    picked = load_decisions(path, SMALL, id_column="request_id", state_columns="team,system",
                            ignore_columns=["exported_by", "export_date", "seniority", "justification"])
    assert picked.rows[0].state == {"team": "sales", "system": "crm"}
    text = load_decisions(path, SMALL, id_column="request_id", text_column="justification",
                          ignore_columns=["exported_by", "export_date", "seniority", "team", "system"])
    assert text.rows[0].state == "need it for project 0" and text.record["states"]["text"] == 40


def test_without_ids_a_row_keeps_its_split_when_the_export_is_resorted_or_filtered(tmp_path):
    rows = [{k: v for k, v in access(i).items() if k not in ("request_id", "exported_by", "export_date")}
            for i in range(120)]
    rows.append(dict(rows[5]))  # the same request twice: held out together, never trained on while scored
    first = load_decisions(write_rows(tmp_path / "a.csv", rows), SMALL)
    assert first.record["ids"] == "from the state" and all(i.startswith("row-") for i in first.rows.ids)
    twin = content_id(first.rows[5].state)
    assert {twin, f"{twin}.2"} <= set(first.rows.ids)
    assert len({s for s in ("train", "validation", "test") if {twin, f"{twin}.2"} & set(first[s].ids)}) == 1
    shuffled = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
    again = load_decisions(write_rows(tmp_path / "b.csv", shuffled), SMALL)
    for split in ("train", "validation", "test"):
        assert set(again[split].ids) == set(first[split].ids), split
    assert again.record["rows sha256"] == first.record["rows sha256"]  # the same rows, whatever their order
    kept = [r for r in rows if r["team"] != "finance"]  # a filtered export: no row moves into or out of test
    part = load_decisions(write_rows(tmp_path / "c.csv", kept), SMALL, min_train=0)
    assert set(part["test"].ids) == set(first["test"].ids) & set(part.rows.ids)


def test_states_typed_as_meant_in_json_cells_and_dataframes():
    rows = [{"state": {"amount": "184.50", "count": np.int64(3), "flag": np.bool_(True), "gap": np.nan,
                       "code": "007", "tags": np.array(["a", "b"]), "when": pd.Timestamp("2026-12-01")},
             "approve": "yes", "level": "read"},
            {"state": json.dumps({"amount": "12", "code": "02139"}), "approve": "n", "level": "admin"}]
    data = load_decisions(pd.DataFrame(rows), SMALL, min_train=0, carve=False)
    first, second = data.rows[0].state, data.rows[1].state
    assert first == {"amount": 184.5, "count": 3, "flag": True, "code": "007", "tags": ["a", "b"],
                     "when": "2026-12-01T00:00:00"}
    assert type(first["count"]) is int and second == {"amount": 12, "code": "02139"}
    assert data.record["states"]["numbers read from strings"] == 2 and data.record["states"]["numbers missing (NaN)"] == 1
    assert "2 numbers read from strings" in data.summary()


@pytest.mark.parametrize("cell, message", [
    ("{'amount': 12, 'ok': True}", r"x.csv:2: field 'state' begins like JSON and is not valid JSON \(Expecting property "
                                   r"name enclosed in double quotes at line 1, column 2\); it is a Python repr"),
    ('{"amount": 12, "note": "cut', r"x.csv:2: field 'state' begins like JSON .* --text-column state"),
    ('{"note": "' + "x" * (EXCEL_CELL_LIMIT - 10), r"it is 32,767 characters long, where Excel cuts a cell"),
])
def test_a_cell_that_looks_like_json_and_is_not_is_refused_with_where_it_broke(tmp_path, cell, message):
    path = tmp_path / "x.csv"
    write_rows(path, [{"state": cell, "approve": "yes", "level": "read"}])
    with pytest.raises(DataError, match=message):
        load_decisions(path, SMALL, min_train=0, carve=False)


def test_a_flat_cell_holding_a_python_repr_is_refused(tmp_path):
    path = write_rows(tmp_path / "x.csv", [{"team": "eng", "tags": "['a', 'b']", "approve": "1", "level": "read"}])
    with pytest.raises(DataError, match=r"x.csv:2: field 'tags' begins like JSON .* Python repr"):
        load_decisions(path, SMALL, min_train=0, carve=False)
    write_rows(path, [{"team": "eng", "note": "[URGENT] please", "approve": "1", "level": "read"}])
    assert load_decisions(path, SMALL, min_train=0, carve=False).rows[0].state["note"] == "[URGENT] please"


def test_cells_of_any_size_and_every_file_kind_by_its_name(tmp_path):
    thread = "re: re: the client visit. " * 20_000  # 520 KB in one cell: past the csv module's 128 KiB default
    path = write_rows(tmp_path / "Thread.CSV", [{"state": thread, "approve": "no", "level": "write"}])
    assert load_decisions(path, SMALL, min_train=0, carve=False).rows[0].state == thread
    with gzip.open(tmp_path / "rows.csv.gz", "wt", encoding="utf-8") as handle:
        handle.write("state,approve,level\nhello,yes,read\n")
    assert load_decisions(tmp_path / "rows.csv.gz", SMALL, min_train=0, carve=False).rows[0].state == "hello"
    (tmp_path / "rows.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"state": "hi", "approve": true, "level": "read"}\n')
    assert load_decisions(tmp_path / "rows.jsonl", SMALL, min_train=0, carve=False).rows[0].state == "hi"
    with pytest.raises(DataError, match=r"rows.xlsx: a .xlsx is not read; expected one of .csv, .tsv"):
        (tmp_path / "rows.xlsx").write_bytes(b"PK")
        load_decisions(tmp_path / "rows.xlsx", SMALL)


def test_refusals_point_the_right_way(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("team,note,approve,level\neng,one, two,yes,read\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"x.csv:2: the row has 5 cells; the header has 4 columns \(split at ',': a "
                                        r"cell holding one needs quotes, or give the file's delimiter"):
        load_decisions(path, SMALL, min_train=0, carve=False)
    path.write_bytes("state,approve,level\nok,yes,read\ncaf\xe9,no,read\n".encode("cp1252"))
    with pytest.raises(DataError, match=r"x.csv:3: not UTF-8 text \(byte 0xe9\).*CSV UTF-8"):
        load_decisions(path, SMALL, min_train=0, carve=False)
    path.write_text(",state,approve,level\nx,ok,yes,read\n", encoding="utf-8")
    with pytest.raises(DataError, match="x.csv:1: column 1 has no name"):
        load_decisions(path, SMALL, min_train=0, carve=False)
    with pytest.raises(DataError, match=r"x.csv:2: state column 'nope' is missing; the row has team, approve, level"):
        write_rows(path, [{"team": "eng", "approve": "yes", "level": "read"}])
        load_decisions(path, SMALL, min_train=0, carve=False, state_columns=["nope"])
