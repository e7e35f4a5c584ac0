"""The numeric guarantee (``precision.ANSWER_TOLERANCE``) under both compute dtypes, whichever this CPU prefers:
an AVX2 machine still runs the bfloat16 path, an AMX machine the float32 one."""

from decisionkit.core.precision import ANSWER_TOLERANCE, kernels
from decisionkit.course.numerics import batch_agreement


def test_batched_answers_agree_with_answers_alone_within_the_documented_tolerance(quick_model, splits):
    _, model = quick_model
    kept = model.backbone.precision
    requests = [{"state": c.state, "workflow": c.workflow} for c in splits["validation"].head(2)]  # 4 workflows
    result = batch_agreement(model, requests, batch_size=3)  # padded batches of mixed workflows and lengths
    table = result.table()
    assert list(table.index) == ["float32", "bfloat16"] and (table["requests"] == 8).all()
    assert table["tolerance"].to_dict() == ANSWER_TOLERANCE
    assert (table["beyond tolerance"] == 0).all(), table
    assert (table["max answer gap"] <= table["tolerance"]).all(), table
    # float32 padding only reorders sums: the standardized features move by rounding alone
    assert table.loc["float32", "max feature move (std)"] < 1e-3, table
    assert model.backbone.precision == kept and result.kernels == kernels()
