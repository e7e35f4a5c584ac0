import numpy as np
import torch

from decisionkit.data.cases import Split
from decisionkit.training.zeroshot import letter_ids, prompt, question_block, zero_shot_predictions


def test_question_block_lists_lettered_options(splits):
    question = splits["test"][0].questions["action"]
    block = question_block(question)
    assert "A. continue: Let the agent proceed without interruption." in block
    assert block.splitlines()[-1] == "Answer with one letter."


def test_cached_prefix_gives_the_same_distribution_as_a_full_prompt(backbone, splits):
    case = splits["validation"][0]
    cases = Split("one", [case], "x")
    (cached,) = zero_shot_predictions(backbone, cases, progress=False)
    for qid, question in case.questions.items():
        ids = backbone.tokenizer(prompt(backbone, case.text, question), add_special_tokens=False,
                                 return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            logits = backbone.model(input_ids=ids).logits[0, -1]
        full = torch.softmax(logits[letter_ids(backbone, len(question.options))], dim=-1).numpy()
        np.testing.assert_allclose(cached[qid], full, atol=2e-3)
        assert abs(cached[qid].sum() - 1) < 1e-6
