import json

import numpy as np
import pytest

from decisionkit.data.cases import load_typed_decisions, read_jsonl, render_state, token_lengths
from decisionkit.data.questions import NOUL_OPTIONS, DataError, Question


def test_split_sizes_and_workflows(splits):
    assert {name: len(split) for name, split in splits.items()} == {"train": 1120, "validation": 80, "test": 400}
    for split in splits.values():
        assert split.workflows == ["agent_trace_observability", "customer_service", "invoice_processing",
                                   "security_incidents"]
    assert splits["validation"].table()["cases"].tolist() == [20, 20, 20, 20]


def test_validation_is_deterministic_and_disjoint(splits, tmp_path):
    train_ids, val_ids = set(splits["train"].ids), set(splits["validation"].ids)
    assert not train_ids & val_ids
    assert not (train_ids | val_ids) & set(splits["test"].ids)
    # The choice does not depend on the order of the file.
    source = splits["train"].source
    lines = open(source, encoding="utf-8").read().splitlines()
    (tmp_path / "train.jsonl").write_text("\n".join(reversed(lines)) + "\n", encoding="utf-8")
    assert set(load_typed_decisions("validation", tmp_path).ids) == val_ids


def test_gold_is_aligned_to_option_order(splits):
    case = splits["test"][0]
    for qid, question in case.questions.items():
        raw = json.loads(open(splits["test"].source, encoding="utf-8").readline())["gold"][qid]["probabilities"]
        np.testing.assert_allclose(case.gold[qid].probabilities, [raw[k] for k in question.options])
        if question.type == "noul":
            assert question.options == NOUL_OPTIONS
        if question.type == "score":
            assert question.options == tuple(str(i) for i in range(len(question.options)))


def test_questions_round_trip_to_system_one_shape(splits):
    for questions in splits["test"].schema().values():
        for qid, question in questions.items():
            assert Question.from_json(qid, question.to_json()) == question


def test_render_state_is_compact_and_keeps_text_states():
    assert render_state({"a": [1, 2], "b": "é"}, "wf") == 'workflow: wf\n{"a":[1,2],"b":"é"}'
    assert render_state("my card was charged twice") == "my card was charged twice"


def test_unknown_split_and_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="expected one of train, validation, test"):
        load_typed_decisions("dev")
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        load_typed_decisions("train", tmp_path)


GOOD = {
    "id": "x_1", "workflow": "wf", "state": {"a": 1},
    "questions": {
        "ok": {"type": "noul", "instructions": "Is it fine?"},
        "pick": {"type": "choice", "instructions": "Which?", "criteria": {"a": "A", "b": "B"}},
        "level": {"type": "score", "instructions": "How much?", "criteria": ["low", "mid", "high"]},
    },
    "gold": {
        "ok": {"probabilities": {"false": 0.25, "true": 0.75}},
        "pick": {"probabilities": {"a": 0.5, "b": 0.5}, "label": "b"},
        "level": {"probabilities": {"0": 0.0, "1": 0.2, "2": 0.8}},
    },
}


def _write(tmp_path, lines):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _with(path_keys, value):
    case = json.loads(json.dumps(GOOD))
    *parents, last = path_keys
    node = case
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return json.dumps(case)


def test_good_case_parses(tmp_path):
    (case,) = read_jsonl(_write(tmp_path, [json.dumps(GOOD)]))
    assert case.gold["pick"].label == "b"  # the stored label is kept
    assert case.gold["ok"].label == "true"  # and computed (first-listed argmax) when absent
    assert case.questions["ok"].options == ("false", "true")


@pytest.mark.parametrize("line, message", [
    ("{not json", r"bad.jsonl:2: not valid JSON"),
    (_with(["gold"], None), r"bad.jsonl:2: field 'gold' is missing"),
    (_with(["gold", "pick"], None), r"bad.jsonl:2: field 'gold.pick' is missing"),
    (_with(["questions", "pick", "type"], "ranking"),
     r"bad.jsonl:2: field 'questions.pick.type' is 'ranking'; expected one of noul, choice, score"),
    (_with(["gold", "pick", "probabilities"], {"a": 0.5, "c": 0.5}),
     r"bad.jsonl:2: field 'gold.pick.probabilities' has keys \['a', 'c'\]; expected the question's options \['a', 'b'\]"),
    (_with(["questions", "level", "criteria"], None),
     r"bad.jsonl:2: field 'questions.level.criteria' of a score question must list its levels"),
    (_with(["questions", "level", "criteria"], ["only one"]),
     r"bad.jsonl:2: field 'questions.level.criteria' of a score question must list its levels"),
    (_with(["gold", "ok", "probabilities"], {"false": 0.5, "true": 0.7}),
     r"bad.jsonl:2: field 'gold.ok.probabilities' sums to 1.200000; expected 1"),
    (_with(["gold", "pick", "label"], "z"), r"bad.jsonl:2: field 'gold.pick.label' is 'z'"),
])
def test_malformed_input_names_file_line_and_field(tmp_path, line, message):
    path = _write(tmp_path, [json.dumps(GOOD), line])
    with pytest.raises(DataError, match=message):
        read_jsonl(path)


def test_token_lengths_table(backbone, splits):
    stats = token_lengths(splits["validation"], backbone.tokenizer)
    table = stats.table()
    assert table.loc["all", "cases"] == 80
    assert table.loc["all", "median"] <= table.loc["all", "p95"] <= table.loc["all", "max"] <= 512
    assert len(stats.figure().data) == 4  # one trace per workflow


def test_token_lengths_count_the_states_longer_than_a_window(backbone, splits):
    stats = token_lengths(splits["validation"], backbone.tokenizer, window=100)
    table = stats.table()
    lengths = stats.lengths
    assert table.loc["all", "over window"] == (lengths > 100).sum() > 0
    per_workflow = table.drop(index="all")["over window"]
    assert per_workflow.sum() == table.loc["all", "over window"]
    assert "over window" not in token_lengths(splits["validation"], backbone.tokenizer).table()
    assert any(shape.x0 == 100 for shape in stats.figure().layout.shapes)  # the window drawn on the histogram
