"""The numeric guarantee (``precision.ANSWER_TOLERANCE``) under both compute dtypes, whichever this CPU prefers:
an AVX2 machine still runs the bfloat16 path, an AMX machine the float32 one."""

from decisionkit.core.precision import ANSWER_TOLERANCE, kernels
from decisionkit.course.numerics import batch_agreement


def test_batched_answers_agree_with_answers_alone_within_the_documented_tolerance(quick_model, splits):
    _, model = quick_model
    kept = model.backbone.precision
    # the shortest state of each workflow: mixed workflows and lengths in as few tokens as that takes (bfloat16
    # without its own instructions, an AVX2 CPU's, runs about six times slower than float32: 1.8 s a decision here)
    validation = splits["validation"]
    requests = [{"state": c.state, "workflow": c.workflow}
                for c in (min((c for c in validation if c.workflow == w), key=lambda c: len(c.text))
                          for w in validation.workflows)]
    result = batch_agreement(model, requests, batch_size=3)  # padded batches of mixed workflows and lengths
    table = result.table()
    assert list(table.index) == ["float32", "bfloat16"] and (table["requests"] == 4).all()
    assert table["tolerance"].to_dict() == ANSWER_TOLERANCE
    assert (table["beyond tolerance"] == 0).all(), table
    assert (table["max answer gap"] <= table["tolerance"]).all(), table
    # float32 padding only reorders sums: the standardized features move by rounding alone
    assert table.loc["float32", "max feature move (std)"] < 1e-3, table
    assert model.backbone.precision == kept and result.kernels == kernels()
