"""The expenses generator in the package (``decisionkit.data.expense_claims``): it still writes the scenario's file
byte for byte, and its drift kind (home-office stipends) is deterministic and labelled by the stated rule."""

import random

from decisionkit.data import expense_claims as ec


def test_the_generator_rewrites_the_scenario_file_byte_for_byte(tmp_path):
    out = tmp_path / "claims.csv"
    assert ec.write_claims(out) == ec.N_CLAIMS
    assert out.read_bytes() == ec.OUT.read_bytes()


def test_drift_claims_are_deterministic_and_of_the_new_kind():
    first, again, other = ec.drift_claims(40, 7), ec.drift_claims(40, 7), ec.drift_claims(40, 8)
    assert first == again and first != other
    assert ec.drift_claims(10, 7) == first[:10]  # the first n of a longer draw
    for state, labels in first:
        assert state["category"] == ec.HOME_OFFICE and state["stipend_period"] in ec.STIPEND_PERIODS
        assert state["policy_limit"]["amount_usd"] == ec.STIPEND_PER_MONTH * ec.STIPEND_PERIODS[state["stipend_period"]]
        assert set(labels) == {"approve", "route", "risk"}


def test_drift_labels_follow_the_stated_rule():
    rng = random.Random(0)
    ineligible = 0
    for number in range(300):
        state, facts = ec.make_home_office_claim(rng, number)
        months = ec.STIPEND_PERIODS[state["stipend_period"]]
        assert facts["ineligible"] == (state["remote_days"] < ec.MIN_REMOTE_DAYS_PER_MONTH * months)
        label = ec.labels(facts)
        if facts["ineligible"]:  # a serious breach: not approved, risk 2 or more, finance unless audit applies
            ineligible += 1
            assert label["approve"] == "false" and int(label["risk"]) >= 2
            assert label["route"] in ("finance", "audit")
        else:  # the export's rule unchanged
            assert label == ec.labels({**facts, "ineligible": False}) == ec.labels(
                {k: v for k, v in facts.items() if k != "ineligible"})
    assert 60 <= ineligible <= 120  # about a third


def test_drift_label_noise_is_the_exports():
    clean, noisy = ec.drift_claims(400, 3, noise=False), ec.drift_claims(400, 3)
    assert [s for s, _ in clean] == [s for s, _ in noisy]  # the same claims, with or without the noise
    for q in ("approve", "route", "risk"):
        moved = sum(a[q] != b[q] for (_, a), (_, b) in zip(clean, noisy))
        assert 5 <= moved <= 40  # about 5% of 400
    assert all(b["route"] in ec.ROUTES and b["risk"] in "0123" for _, b in noisy)
