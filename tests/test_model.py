import json

import numpy as np
import pytest
import torch

import decisionkit
from decisionkit.contract import systemone
from decisionkit.contract.systemone import QuestionError, answer
from decisionkit.core.precision import ANSWER_TOLERANCE, Precision
from decisionkit.data.cases import Split
from decisionkit.model.decision_model import DecisionModel, FeatureSpec, load
from decisionkit.model.heads import Temperatures
from decisionkit.model.saving import CONFIG_FILE


@pytest.fixture(scope="module")
def model(tiny_backbone, splits):
    """Mechanics alone (shapes, batching, saving, temperatures): the tiny backbone, random heads."""
    torch.manual_seed(0)
    m = DecisionModel(tiny_backbone, splits["train"].schema(), FeatureSpec(max_length=128))
    for head in m.heads.heads.values():
        torch.nn.init.normal_(head.weight, std=0.01)
    return m


def test_spec_resolves_depth_fractions(model):
    assert model.spec.layers == (1, 2, 3, 4)  # the tiny backbone's 4 layers
    assert FeatureSpec().resolved(30).layers == (8, 15, 22, 30)  # SmolLM2's 30
    assert FeatureSpec(layers=(0.5, 7)).resolved(36).layers == (18, 7)


def test_decide_answers_every_question_in_system_one_shape(model, splits):
    case = splits["test"][0]
    answers = model.decide(case.state, workflow=case.workflow)
    assert list(answers) == list(case.questions)
    for qid, ans in answers.items():
        question = case.questions[qid]
        assert ans["type"] == question.type
        if question.type == "noul":
            assert set(ans) == {"type", "noul"} and 0 <= ans["noul"] <= 1
        else:
            assert list(ans["probabilities"]) == list(question.options)
            assert sum(ans["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
            assert ans["confidence"] == pytest.approx(max(ans["probabilities"].values()))
        if question.type == "choice":
            assert ans["choice"] == max(ans["probabilities"], key=ans["probabilities"].get)
        if question.type == "score":
            expected = sum(int(k) * p for k, p in ans["probabilities"].items())
            assert ans["score"] == pytest.approx(expected, abs=1e-6)


def test_decide_infers_the_workflow_from_the_questions(model, splits):
    case = splits["test"][0]
    asked = {qid: q.to_json() for qid, q in case.questions.items()}
    assert model.decide(case.state, asked) == model.decide(case.state, workflow=case.workflow)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decide_matches_batch_predict(model, splits, dtype, monkeypatch):
    monkeypatch.setattr(model.backbone, "precision", Precision("cpu", dtype, "test"))
    cases = Split("two", splits["validation"].head(1).cases[:2], "x")
    batch = model.predict(cases)  # from the features of a split, one state at a time
    tolerance = ANSWER_TOLERANCE[dtype]
    for case, probs in zip(cases, batch):
        one = model.decide(case.state, workflow=case.workflow)
        for qid, question in case.questions.items():
            if question.type == "noul":
                assert one[qid]["noul"] == pytest.approx(probs[qid][1], abs=tolerance)
            else:
                np.testing.assert_allclose(list(one[qid]["probabilities"].values()), probs[qid], atol=tolerance)


def test_bad_questions_are_named(model, splits):
    case = splits["test"][0]
    with pytest.raises(QuestionError, match="pass workflow= one of"):
        model.decide(case.state)
    with pytest.raises(QuestionError, match="question 'colour': no trained head in workflow"):
        model.decide(case.state, {"colour": {"type": "noul", "instructions": "?"}}, workflow=case.workflow)
    asked = case.questions["action"].to_json()
    asked["criteria"] = {"continue": "", "stop": ""}
    with pytest.raises(QuestionError, match=r"options \['continue', 'stop'\] differ from the trained head's"):
        model.decide(case.state, {"action": asked}, workflow=case.workflow)
    with pytest.raises(QuestionError, match="type 'noul' differs"):
        model.decide(case.state, {"action": {"type": "noul", "instructions": ""}}, workflow=case.workflow)


def test_save_load_round_trip_is_atomic_and_checks_the_backbone(model, splits, tmp_path):
    case = splits["test"][3]
    model.temperatures = Temperatures({"noul": 1.0, "choice": 1.7, "score": 1.0}, {"noul": 1.0, "choice": 0.6,
                                                                                   "score": 1.2})
    try:
        path = model.save(tmp_path / "m")
        first = model.decide(case.state, workflow=case.workflow)
        assert sorted(p.name for p in path.iterdir()) == [CONFIG_FILE, "heads.safetensors"]
        assert all(p.stat().st_mode & 0o044 == 0o044 for p in path.iterdir())  # readable by others, like any file
        again = decisionkit.load(path)
        assert again.temperatures == model.temperatures  # the part whole: both sets, as fitted
        assert again.decide(case.state, workflow=case.workflow) == first
        (path / "history.json").write_text("{}")  # what training and reports write beside the model
        (path / "checkpoint").mkdir()
        (path / "checkpoint" / "trainer.json").write_text("{}")
        model.save(path)  # overwriting keeps one folder, no leftovers, and what else the folder held
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
        assert sorted(p.name for p in path.iterdir()) == sorted([CONFIG_FILE, "heads.safetensors", "checkpoint",
                                                                 "history.json"])
        assert (path / "checkpoint" / "trainer.json").read_text() == "{}"
        config = json.loads((path / CONFIG_FILE).read_text())
        config["backbone"]["weights_sha256"] = "f" * 64
        (path / CONFIG_FILE).write_text(json.dumps(config))
        with pytest.raises(ValueError, match="trained on"):
            load(path)
    finally:
        model.temperatures = Temperatures()


def test_answer_shapes():
    from decisionkit.data.questions import Question

    score_q = Question("s", "score", "", ("0", "1", "2"), ("a", "b", "c"))
    out = answer(score_q, np.array([0.2, 0.3, 0.5]))
    assert out["score"] == pytest.approx(1.3) and out["confidence"] == pytest.approx(0.5)
    assert answer(Question("n", "noul", "", ("false", "true"), ("", "")), np.array([0.1, 0.9])) == {
        "type": "noul", "noul": pytest.approx(0.9)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decide_many_equals_decide_per_request(model, splits, dtype, monkeypatch):
    monkeypatch.setattr(model.backbone, "precision", Precision("cpu", dtype, "test"))
    cases = splits["validation"].head(2).cases  # 8 states of 4 workflows, of different lengths
    requests = [{"state": c.state, "workflow": c.workflow} for c in cases]
    requests[0] = {"state": cases[0].state, "questions": {q: x.to_json() for q, x in cases[0].questions.items()}}
    many = model.decide_many(requests, batch_size=3)  # padded batches, mixed workflows
    assert len(many) == len(requests)
    for request, got in zip(requests, many):
        assert systemone.disagreements(got, model.decide(**request), ANSWER_TOLERANCE[dtype]) == []
    with pytest.raises(ValueError, match="no anomaly threshold"):
        model.decide_many(requests[:1], route=True)


def test_one_forward_gives_features_logits_per_question_and_the_loss(model, splits, monkeypatch):
    from decisionkit.core.precision import Precision
    from decisionkit.model.heads import targets

    monkeypatch.setattr(model.backbone, "precision", Precision("cpu", "float32", "test"))  # padding: sums' order only

    cases = Split("mixed", [splits["validation"][i] for i in (0, 21, 1)], "test")  # two workflows, interleaved
    target = targets(cases)
    output = model(**model.tokenize(cases.texts), workflows=cases.case_workflows, target=target)
    assert output.features.shape == (3, model.heads.heads[next(iter(model.heads.heads))].in_features)
    assert output.rows == {cases[0].workflow: [0, 2], cases[1].workflow: [1]}
    per_case = output.per_case()
    for i, case in enumerate(cases):
        assert per_case[i].keys() == case.questions.keys()
        alone = model(**model.tokenize([case.text]), workflows=[case.workflow])  # the same input read on its own
        for qid, z in per_case[i].items():
            assert torch.allclose(z, alone.logits[case.workflow][qid][0], atol=1e-4)
    by_hand = sum(-(torch.tensor(c.gold[q].probabilities) * torch.log_softmax(per_case[i][q].double(), -1)).sum()
                  for i, c in enumerate(cases) for q in c.questions) / target.decisions  # soft-gold cross-entropy
    assert output.loss.item() == pytest.approx(by_hand.item(), rel=1e-4)
    assert model(**model.tokenize(cases.texts), workflows=cases.case_workflows).loss is None


def test_the_answers_divide_by_the_models_temperatures(model):
    workflow, qid = next((w, q) for w, qs in model.schema.items() for q, x in qs.items() if x.type == "score")
    z = torch.tensor([0.0, 1.0, 3.0, 0.5])[:len(model.schema[workflow][qid].options)]
    assert not model.temperatures.fitted
    model.temperatures = Temperatures({"noul": 1.0, "choice": 1.0, "score": 2.0},
                                      {"noul": 1.0, "choice": 1.0, "score": 0.5})
    try:
        assert model.temperatures.fitted
        p, confidence = model.answer_parts({qid: z}, workflow)[qid]
        assert p == pytest.approx(torch.softmax(z / 2.0, -1).double().numpy())
        assert confidence == pytest.approx(float(torch.softmax(z / 0.5, -1)[int(np.argmax(p))]))
        model.temperatures.confidence = None  # no separate fit: the confidence is the top probability
        p, confidence = model.answer_parts({qid: z}, workflow)[qid]
        assert confidence == pytest.approx(float(p.max()))
    finally:
        model.temperatures = Temperatures()


def test_saved_quantization_settings_come_back(model, tmp_path, monkeypatch):
    from decisionkit.model import decision_model as model_module
    from decisionkit.model.backbone import QuantSettings

    quant = QuantSettings(quant_type="fp4", double_quant=False, compute_dtype="bfloat16")
    monkeypatch.setattr(model.backbone, "quantize", quant)
    path = model.save(tmp_path / "q")
    asked = {}

    def spy(name, quantize=None, device=None, **how):  # records what load asks for, then loads the plain backbone
        asked["quantize"] = quantize
        return model.backbone

    monkeypatch.setattr(model_module, "load_backbone", spy)
    load(path)
    assert asked["quantize"] == quant


def _saved_with(model, path, **changes):
    """``model`` saved to ``path`` with these top-level fields of its config changed."""
    model.save(path)
    config = json.loads((path / CONFIG_FILE).read_text())
    (path / CONFIG_FILE).write_text(json.dumps({**config, **changes}))
    return path


@pytest.mark.parametrize("field, value, message", [
    ("format", 0, "format 0; this decisionkit reads 1"),
    ("render_version", "v0", "rendering 'v0'; this decisionkit renders"),
    ("calibrated_by", "me", r"fields \['calibrated_by'\] differ from format 1's"),  # a field no part reads
])
def test_load_refuses_another_format_or_rendering(model, tmp_path, field, value, message):
    with pytest.raises(ValueError, match=f"decisionkit.json: {message}"):
        load(_saved_with(model, tmp_path / "m", **{field: value}))




# ----- states longer than one window ---------------------------------------------------------------------------
WINDOW = 32  # tokens a window in these tests: most typed-decisions states take several


@pytest.fixture(scope="module")
def windowed(tiny_backbone, splits):
    """The tiny backbone read in windows of 32 tokens, at most 4 (128 tokens), random heads."""
    torch.manual_seed(1)
    m = DecisionModel(tiny_backbone, splits["train"].schema(), FeatureSpec(max_length=WINDOW, max_windows=4))
    for head in m.heads.heads.values():
        torch.nn.init.normal_(head.weight, std=0.01)
    return m


def _by_windows(model, cases) -> dict[int, list]:
    """``cases`` by how many windows of the model's length their rendered state takes."""
    from decisionkit.model.windows import window_lengths

    _, needed = window_lengths(model.backbone, [c.text for c in cases], model.spec.max_length)
    found: dict[int, list] = {}
    for case, n in zip(cases, needed):
        found.setdefault(int(n), []).append(case)
    return found


def test_a_state_of_several_windows_is_answered_and_pooled_across_them(windowed, splits, monkeypatch):
    from decisionkit.model.features import extract_features
    from decisionkit.model.windows import tokenize

    monkeypatch.setattr(windowed.backbone, "precision", Precision("cpu", "float32", "test"))
    case = _by_windows(windowed, splits["validation"])[3][0]
    windows = systemone.state_windows(windowed, case.text)
    assert len(windows) == 3 and all(len(ids) <= WINDOW for ids in windows)
    answers = windowed.decide(case.state, workflow=case.workflow)
    assert list(answers) == list(case.questions)
    with torch.inference_mode():
        read = windowed.pooled(windowed.pad([windows]))  # what decide reads
        first = windowed.pooled(tokenize(windowed.backbone, [case.text], WINDOW))  # the first window alone
    assert read.shape == first.shape == (1, windowed.feature_mean.numel())
    assert not torch.allclose(read, first, atol=1e-3)
    # the training features (extract_features, cached per split) read the same windows
    spec = windowed.spec
    features = extract_features(windowed.backbone, Split("one", [case], "test"), layers=spec.layers,
                                max_length=WINDOW, max_windows=spec.max_windows, cache=False)
    cached = np.hstack([features.get(spec.pooling, layer) for layer in spec.layers])
    np.testing.assert_allclose(cached[0], read[0].numpy(), rtol=1e-5, atol=1e-5)
    assert features.windows.tolist() == [3] and features.cut == 0
    # forward takes tokenize's output as it is: one row per state, whatever its windows
    batch = windowed.tokenize([case.text, "short"])
    assert batch["owner"].tolist() == [0, 0, 0, 1]
    output = windowed(**batch, workflows=[case.workflow] * 2)
    assert output.features.shape[0] == 2


def test_past_the_cap_decide_refuses_and_training_cuts(windowed, splits):
    case = max(splits["validation"], key=lambda c: len(c.text))
    windows = max(_by_windows(windowed, splits["validation"]))
    assert windows > windowed.spec.max_windows  # the longest states need more than 4 windows of 32 tokens
    with pytest.raises(QuestionError, match=r"field 'state' is \d+ tokens once rendered; the model reads at most "
                                            r"128 \(4 windows of 32\)") as refused:
        windowed.decide(case.state, workflow=case.workflow)
    assert refused.value.loc == ("state",) and refused.value.kind == "too_long"
    with pytest.raises(QuestionError, match="field 'state'"):
        windowed.decide_many([{"state": case.state, "workflow": case.workflow}])
    batch = windowed.tokenize([case.text])  # training keeps the first 4 windows
    assert batch["owner"].tolist() == [0] * 4
    from decisionkit.model.windows import over_cap

    lengths = _by_windows(windowed, splits["validation"])
    short = lengths[min(lengths)][0]  # within the cap
    assert over_cap(windowed, Split("two", [short, case], "test")) == [case.id]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decide_many_with_one_and_several_windows_agrees_with_decide(windowed, splits, dtype, monkeypatch):
    monkeypatch.setattr(windowed.backbone, "precision", Precision("cpu", dtype, "test"))
    lengths = _by_windows(windowed, splits["validation"])
    cases = lengths[4][:2] + lengths[3][:1]  # no typed-decisions state fits in one window of 32 tokens
    requests = [{"state": c.state, "workflow": c.workflow} for c in cases]
    requests.insert(1, {"state": "a short note", "workflow": cases[0].workflow})  # one window each
    requests.append({"state": {"ticket": "refund please", "priority": 2}, "workflow": cases[-1].workflow})
    many = windowed.decide_many(requests, batch_size=5)  # 4 + 1 + 4 + 3 + 1 windows: passes of at most 5
    for request, got in zip(requests, many):
        assert systemone.disagreements(got, windowed.decide(**request), ANSWER_TOLERANCE[dtype]) == []


def test_the_cap_is_saved_and_a_model_saved_before_reads_the_default(windowed, tmp_path):
    path = windowed.save(tmp_path / "w")
    config = json.loads((path / CONFIG_FILE).read_text())
    assert config["features"]["max_windows"] == 4 and load(path).spec.max_windows == 4
    del config["features"]["max_windows"]  # as a model saved before windows
    assert FeatureSpec.from_json(config["features"]).max_windows == FeatureSpec().max_windows == 8
    assert FeatureSpec().max_tokens == 4096
