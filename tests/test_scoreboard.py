import json

import pytest

from decisionkit.course.scoreboard import GPU_PRESET, SEED, Measured, find_run, scoreboard, seed_value
from decisionkit.model.saving import HISTORY_FILE, REPORT_FILE
from decisionkit.training.report import REFERENCES


def saved_run(root, name, preset, accuracy=None):
    """A run folder as training writes it: history.json always, report.json once a run report is complete."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / HISTORY_FILE).write_text(json.dumps({"preset": {"name": preset}, "history": []}))
    if accuracy is not None:
        (folder / REPORT_FILE).write_text(json.dumps({"training": {"preset": preset}, "test": {"accuracy": accuracy}}))
    return folder


def test_the_board_holds_every_seed_figure_quoted_as_the_seed_writes_it():
    board = scoreboard({"test accuracy": Measured(0.7642, "400 test cases")}, "a CPU, float32")
    table = board.table()
    assert list(table.index[:len(SEED)]) == list(SEED) and len(table) == len(SEED) + 2  # + the ratio and gpu rows
    for name, seed in SEED.items():
        assert table.loc[name, "seed"] == seed.quoted and table.loc[name, "why they differ"]
        assert table.loc[name, "seed source"].startswith("seed ")
    assert table.loc["test accuracy", "ours"] == "76.4%" and board["test accuracy"].value == 0.7642
    assert table.loc["training time", "ours"] == "not measured"  # left out: said, not hidden
    markdown = board._repr_markdown_()
    assert markdown.startswith("Ours measured on: a CPU, float32.") and all(name in markdown for name in SEED)
    for quoted in ("7.95 GB", "30.5%", "80.5%", "74.9%", "0.187", "0.036", "191.4 ms", "3,679.8 ms", "~16 ms", "22-28 ms",
                   "54.3%", "99.97%", "89.31%", "0.63%", "77.21%", "84.7%", "~15 min"):
        assert quoted in markdown


def test_the_reference_table_reads_the_seed_accuracies_from_the_one_place():
    rows = REFERENCES["accuracy"]
    assert rows["Qwen3.5-4B 4-bit + LoRA r16 (reference run, validation)"] == SEED["validation accuracy"].value == 0.805
    assert rows["Qwen3.5-4B 4-bit + LoRA r16 (reference run, test)"] == SEED["test accuracy"].value == 0.749
    assert rows["Qwen3.5-4B zero-shot (reference run)"] == SEED["zero-shot accuracy"].value == 0.305


def test_the_latency_ratio_is_ours_on_one_backbone_not_the_rows_above():
    # The rows hold the main model's decide (MiniLM) and SmolLM2's generation: their quotient would set two backbones
    # against each other, so the ratio row shows only the one-backbone ratio it is given.
    rows = {"decision latency": Measured(40.0, "p50"), "generated JSON latency": Measured(2200.0, "p50")}
    board = scoreboard(rows, "a CPU", ratio=Measured(7.5, "SmolLM2 hybrid, 4 cases"))
    ratio = board["generated JSON latency / decision latency, one backbone"]
    assert ratio.value == pytest.approx(7.5) and ratio.ours == "7.5x" and ratio.how == "SmolLM2 hybrid, 4 cases"
    assert ratio.seed == f"{3679.8 / 191.4:.1f}x" == "19.2x"
    assert board.table().loc["decision latency", "ours"] == "40.0 ms"
    assert board.table().loc["generated JSON latency", "ours"] == "2,200 ms"
    alone = scoreboard(rows, "a CPU")  # no one-backbone ratio measured: said, not computed across backbones
    assert alone["generated JSON latency / decision latency, one backbone"].ours == "not measured"
    assert seed_value("distilled small model latency") == 25.0  # a quoted range's middle


def test_the_gpu_row_says_not_run_unless_a_gpu_run_is_saved(tmp_path):
    runs = tmp_path / "runs"
    saved_run(runs, "notebook-03-cpu-fast", "cpu-fast", 0.764)
    assert find_run(GPU_PRESET, [runs, tmp_path / "absent"]) is None
    gpu = f"the {GPU_PRESET} preset (the seed's recipe): test accuracy"
    row = scoreboard({}, "a CPU", find_run(GPU_PRESET, [runs]))[gpu]
    assert row.ours == "not run" and row.value is None and "no saved run" in row.how

    saved_run(runs, "reference", GPU_PRESET)  # trained, not yet reported
    assert find_run(GPU_PRESET, [runs]) == runs / "reference"
    assert scoreboard({}, "a GPU", runs / "reference")[gpu].ours == "not measured"
    (runs / "reference" / REPORT_FILE).write_text(json.dumps({"training": {"preset": GPU_PRESET},
                                                              "test": {"accuracy": 0.751}}))
    row = scoreboard({}, "a GPU", find_run(GPU_PRESET, [runs]))[gpu]
    assert row.ours == "75.1%" and row.value == 0.751 and "reference" in row.how


def test_a_figure_the_seed_never_published_is_refused():
    with pytest.raises(ValueError, match="no seed figure is named 'test acuracy'"):
        scoreboard({"test acuracy": Measured(0.7, "typo")}, "a CPU")


def test_beside_sets_several_of_ours_beside_one_seed_figure():
    from decisionkit.course.scoreboard import COLUMNS, beside

    table = beside({"head alone": ("one more question on a shared encoding", Measured(0.029, "fitted slope")),
                    "head + trees": ("one more question on a shared encoding", Measured(0.95, "fitted slope")),
                    "ECE before": ("ECE before temperature scaling", Measured(0.1304, "2000 test decisions"))})
    assert list(table.columns) == COLUMNS and list(table.index) == ["head alone", "head + trees", "ECE before"]
    assert (table.loc[["head alone", "head + trees"], "seed"] == "~16 ms").all()
    assert table.loc["head + trees", "ours"] == "0.950 ms" and table.loc["ECE before", "ours"] == "0.130"
    assert table.loc["ECE before", "ours measured as"] == "2000 test decisions"
    with pytest.raises(ValueError, match="no seed figure is named 'speed'"):
        beside({"x": ("speed", Measured(1.0, "x"))})
