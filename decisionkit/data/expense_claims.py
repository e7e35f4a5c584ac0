"""The expenses scenario's generator: 500 labelled expense claims of a fictional company
(``decisionkit/scenario_data/expenses/claims.csv``), and a kind of claim that export never had (``drift_claims``).

Why: the hybrid (a frozen encoder's pooled states beside trees on the state's fields) needs answers that depend
on both kinds of evidence. Every state is a JSON claim: numbers, flags and short categories that trees read well
and a mean-pooled encoder reads badly (amount against the policy limit, receipt, age, items that do not add up,
prior claims, the employee's level), and a free-text ``note`` whose meaning matters and that trees cannot read (a
personal expense, a duplicate, an approval given in advance, a harmless explanation, in many phrasings). The
labels of ``approve``, ``route`` and ``risk`` follow the rules in the scenario's README.md, then about 5% of each
question's labels are moved to a neighbouring option so that the data is not trivially separable.

The CSV is what a user's export looks like: ``id``, ``state`` (the claim as a JSON string) and one column per
question, with hard labels. Standard library only, seeded: ``write_claims()`` (``scripts/make_expense_claims.py``)
rewrites it byte for byte. The words (merchants, items, the notes' templates) are ``expense_words``'.

**Drift** (``drift_claims``): ``home_office`` claims, a remote-work stipend the export never had: new fields (the
stipend's period, the days worked from home in it), items of a home office, and notes in a terse style of their
own. They are labelled by the same ``labels`` rule, extended by one stated rule (the README's "Drift" section): a
stipend claimed for fewer than ``MIN_REMOTE_DAYS_PER_MONTH`` remote days a month of its period is *ineligible*, a
serious breach that finance must check; then the same label noise.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from .expense_words import (
    APPROVAL_LIMIT,
    CATEGORIES,
    CATEGORY_WEIGHTS,
    CITIES,
    CLIENTS,
    CONFERENCES,
    CONTEXT,
    CURRENCIES,
    DEPARTMENTS,
    FILLER,
    GREETINGS,
    ITEMS,
    LEVEL_WEIGHTS,
    LEVELS,
    LIMITS,
    MERCHANTS,
    MILEAGE_RATE,
    MONTHS,
    OPENERS,
    PAYMENT,
    PEOPLE,
    SIGNALS,
    SIGNOFFS,
    TAILS,
    THINGS,
    TRIP_CATEGORIES,
    TRIP_CONTEXT,
)

SEED = 2026
N_CLAIMS = 500
N_LONG = 15  # claims whose note is a pasted e-mail thread of 700-1,300 words (past 512 MiniLM tokens)
NOISE = 0.05  # share of each question's labels moved to a neighbouring option
OUT = Path(__file__).resolve().parent.parent / "scenario_data" / "expenses" / "claims.csv"

def pick(rng: random.Random, options: list, weights: list | None = None):
    return rng.choices(options, weights=weights, k=1)[0] if weights else options[rng.randrange(len(options))]


def fill(rng: random.Random, text: str, category: str, fixed: dict | None = None) -> str:
    """The template with its slots filled at random; ``fixed`` slots (a thread's client and city) win."""
    person = pick(rng, PEOPLE)
    slots = {"city": pick(rng, CITIES), "client": pick(rng, CLIENTS), "person": person, "n": str(rng.randint(1000, 9999)),
             "thing": THINGS[category], "cur": pick(rng, CURRENCIES[1:]), "conf": pick(rng, CONFERENCES),
             "dept": pick(rng, DEPARTMENTS), "first": person.split()[0]}
    slots.update(fixed or {})
    return text.format(**slots)


def core(rng: random.Random, signal: str, category: str) -> str:
    fitting = [t for cats, t in SIGNALS[signal] if cats is None or category in cats]
    return fill(rng, pick(rng, fitting), category)


def typo(rng: random.Random, text: str) -> str:
    """One small slip: two letters swapped, a letter dropped, all lower case, or the final full stop gone."""
    kind = rng.randrange(4)
    words = text.split(" ")
    long_words = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
    if kind == 0 and long_words:
        i = pick(rng, long_words)
        w = words[i]
        j = rng.randrange(1, len(w) - 2)
        words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
        return " ".join(words)
    if kind == 1 and long_words:
        i = pick(rng, long_words)
        w = words[i]
        j = rng.randrange(1, len(w) - 1)
        words[i] = w[:j] + w[j + 1:]
        return " ".join(words)
    if kind == 2:
        return text.lower()
    return text.rstrip(".")


def short_note(rng: random.Random, signal: str, category: str) -> str:
    """A note of about 6-45 words: the signal's sentence, padded with neutral context to a length drawn the same way
    for every signal, so that the note's length says nothing about the label."""
    target = rng.randint(6, 28)
    parts = [core(rng, signal, category)]
    contexts = CONTEXT + (TRIP_CONTEXT if category in TRIP_CATEGORIES else [])
    rng.shuffle(contexts)
    while sum(len(p.split()) for p in parts) < target and contexts:
        sentence = fill(rng, contexts.pop(), category)
        parts.insert(rng.randrange(len(parts) + 1), sentence)
    text = " ".join(parts)
    if rng.random() < 0.3:
        text = pick(rng, OPENERS) + text[0].lower() + text[1:]
    if rng.random() < 0.3:
        text = text + " " + fill(rng, pick(rng, TAILS), category)
    if rng.random() < 0.12:
        text = typo(rng, text)
    return text


def email_thread(rng: random.Random, signal: str, category: str) -> str:
    """A pasted e-mail thread of 700-1,300 words about one client and city, newest message first; the signal's
    sentence sits in one message, anywhere (so often past the encoder's 512 tokens)."""
    fixed = {"client": pick(rng, CLIENTS), "city": pick(rng, CITIES)}
    subject = f"RE: {fixed['client']} {pick(rng, ['workshop', 'visit', 'offsite', 'kickoff', 'rollout'])}"
    people = rng.sample(PEOPLE, 4)
    target = rng.randint(700, 1150)  # the last message may add up to about 150 words
    bodies, words = [], 0
    while words < target:
        body = [fill(rng, pick(rng, FILLER), category, fixed) for _ in range(rng.randint(4, 9))]
        bodies.append(body)
        words += sum(len(b.split()) for b in body) + 20  # about 20 words of header, greeting and sign-off
    body = bodies[rng.randrange(len(bodies))]
    body.insert(rng.randrange(len(body) + 1), core(rng, signal, category))
    month, day = rng.randrange(3), rng.randint(1, 5)  # two days between messages: at most the 30th
    messages = []
    for i, body in enumerate(bodies):
        sender, to = people[i % 4], people[(i + 1 + rng.randrange(3)) % 4]
        header = (f"From: {sender} <{sender.lower().replace(' ', '.')}@northwind-example.com>\n"
                  f"Sent: {MONTHS[month]} {day + 2 * i}, 2026 {rng.randint(7, 18)}:{rng.randint(0, 59):02d}\n"
                  f"To: {to}\nSubject: {subject}")
        greeting = pick(rng, GREETINGS).replace("{first}", to.split()[0])
        messages.append("\n".join([header, "", greeting, " ".join(body), "", pick(rng, SIGNOFFS), sender.split()[0]]))
    intro = pick(rng, ["Pasting the thread for context:", "See the email chain below.", "Forwarded thread below.",
                       "Background in the emails below, sorry it's long."])
    return intro + "\n\n" + "\n\n-----\n\n".join(reversed(messages))


def over_ratio(rng: random.Random, signal: str, low: float) -> float:
    """A claim's amount against its limit: over it for most approved exceptions (the overage is what was approved),
    else for about a third of claims; under it, from ``low`` of the limit up."""
    if rng.random() < (0.85 if signal == "exception" else 0.33):
        return rng.uniform(1.08, 1.5) if rng.random() < 0.6 else rng.uniform(1.5, 3.0)
    return rng.uniform(low, 1.0) if rng.random() < 0.85 else rng.uniform(1.0, 1.05)


def split_amount(rng: random.Random, total: float, n: int) -> list[float]:
    weights = [rng.uniform(0.3, 1.0) for _ in range(n)]
    shares = [round(total * w / sum(weights), 2) for w in weights]
    shares[0] = round(total - sum(shares[1:]), 2)
    return shares


def make_claim(rng: random.Random, number: int, long_note: bool) -> tuple[dict, dict]:
    """One claim state and the hidden facts its labels are computed from."""
    level = pick(rng, LEVELS, LEVEL_WEIGHTS)
    category = pick(rng, CATEGORIES, CATEGORY_WEIGHTS)
    signal = pick(rng, ["neutral", "benign", "personal", "duplicate", "exception"], [30, 22, 14, 13, 21])
    base, basis = LIMITS[category]
    employee = {"level": level, "department": pick(rng, DEPARTMENTS)}
    if rng.random() < 0.93:
        employee["tenure_years"] = min(int(rng.expovariate(1 / 4)), 30)

    units, attendees, nights, distance = 1, None, None, None
    if category in ("meals", "client_gift"):
        attendees = pick(rng, [1, 2, 2, 3, 3, 4, 5, 6, 8, 10])
        units = attendees
    elif category == "lodging":
        nights = pick(rng, [1, 1, 2, 2, 3, 4, 5])
        units = nights
    limit = base * units * (1.5 if level == "director" and category in ("travel", "lodging") else 1)

    amount = round(limit * over_ratio(rng, signal, 0.2), 2)
    if category == "mileage":
        distance = round(amount / MILEAGE_RATE)
        amount = round(distance * MILEAGE_RATE, 2)

    receipt = rng.random() > 0.14
    days = rng.randint(1, 59) if rng.random() < 0.84 else (rng.randint(60, 90) if rng.random() < 0.5
                                                          else rng.randint(91, 240))
    prior = min(int(rng.expovariate(1 / 2.8)), 14)

    n_items = pick(rng, [1, 1, 2, 2, 3, 3, 4, 5])
    mismatch = rng.random() < 0.11
    item_total = amount * (rng.uniform(1.12, 1.6) if rng.random() < 0.5 else rng.uniform(0.4, 0.88)) if mismatch \
        else amount
    names = ITEMS[category][:]
    rng.shuffle(names)
    items = [{"description": names[i % len(names)], "amount_usd": a}
             for i, a in enumerate(split_amount(rng, round(item_total, 2), n_items))]

    state = {"claim_id": f"EXP-{10000 + number * 7 + rng.randrange(7)}",
             "submitted": f"2026-{rng.randint(9, 11):02d}-{rng.randint(1, 28):02d}",
             "employee": employee, "category": category}
    if rng.random() < 0.85:
        state["merchant"] = pick(rng, MERCHANTS[category])
    state["amount_usd"] = amount
    state["policy_limit"] = {"amount_usd": round(limit, 2), "basis": basis}
    if rng.random() < 0.7:
        state["currency"] = pick(rng, CURRENCIES, [60, 15, 8, 8, 4, 5])
    state["payment_method"] = pick(rng, PAYMENT)
    state["receipt_attached"] = receipt
    state["days_since_expense"] = days
    state["items"] = items
    if attendees is not None and (category == "client_gift" or rng.random() < 0.95):
        state["attendees" if category == "meals" else "recipients"] = attendees
    if nights is not None:
        state["nights"] = nights
    if distance is not None:
        state["distance_km"] = distance
    state["prior_claims_90d"] = prior
    if rng.random() < 0.5:
        state["project_code"] = f"PRJ-{rng.randint(100, 999)}"
    if long_note:
        state["note"] = email_thread(rng, signal, category)
    elif signal != "neutral" or rng.random() < 0.75:  # a few routine claims come without any note
        state["note"] = short_note(rng, signal, category)
    else:
        signal = "none"

    facts = {"signal": signal, "ratio": amount / limit, "amount": amount, "receipt": receipt, "days": days,
             "prior": prior, "mismatch": abs(sum(i["amount_usd"] for i in items) - amount) > 0.05 * amount,
             "level": level}
    return state, facts


def labels(f: dict) -> dict:
    """The rules of README.md: text evidence (the note's meaning) and field evidence, combined."""
    personal, duplicate, exception = (f["signal"] == s for s in ("personal", "duplicate", "exception"))
    over = f["ratio"] > 1.05
    no_receipt = not f["receipt"] and f["amount"] > 75
    late, very_late = f["days"] > 60, f["days"] > 90
    frequent = f["prior"] >= 8
    ineligible = f.get("ineligible", False)  # a home-office stipend for too few remote days (drift_claims only)
    approve = not (personal or duplicate or very_late or no_receipt or f["mismatch"] or (over and not exception)
                   or ineligible)

    serious = (over and not exception) + no_receipt + f["mismatch"] + very_late + ineligible
    minor = (over and exception) or late or frequent or f["amount"] > APPROVAL_LIMIT[f["level"]]
    field_level = 3 if serious >= 2 else 2 if serious else 1 if minor else 0
    risk = 3 if personal or duplicate else field_level

    if personal or duplicate or serious >= 2:
        route = "audit"
    elif late or no_receipt or f["mismatch"] or ineligible:
        route = "finance"
    elif over or exception or f["amount"] > APPROVAL_LIMIT[f["level"]]:
        route = "manager"
    else:
        route = "auto_approve"
    return {"approve": "true" if approve else "false", "route": route, "risk": str(risk)}


ROUTES = ["auto_approve", "manager", "finance", "audit"]


def noisy(rng: random.Random, label: dict) -> dict:
    """About NOISE of each question's labels moved to a neighbouring option (noul: flipped)."""
    out = dict(label)
    if rng.random() < NOISE:
        out["approve"] = "false" if label["approve"] == "true" else "true"
    if rng.random() < NOISE:
        i = ROUTES.index(label["route"])
        out["route"] = ROUTES[i + 1] if i == 0 else ROUTES[i - 1] if i == 3 else ROUTES[i + pick(rng, [-1, 1])]
    if rng.random() < NOISE:
        r = int(label["risk"])
        out["risk"] = str(r + 1 if r == 0 else r - 1 if r == 3 else r + pick(rng, [-1, 1]))
    return out


def write_claims(out: Path, claims: int = N_CLAIMS, long_claims: int = N_LONG) -> int:
    """Write ``claims`` claims (``long_claims`` of them with a pasted e-mail thread) to ``out``; the defaults write the
    scenario's own file. ``benchmarks/own_data.py`` scales it to a user's log of 100,000 rows."""
    rng = random.Random(SEED)
    long_at = set(rng.sample(range(claims), long_claims))
    rows = []
    for number in range(claims):
        state, facts = make_claim(rng, number, number in long_at)
        label = noisy(rng, labels(facts))
        rows.append([f"exp-{number + 1:0{max(4, len(str(claims)))}d}", json.dumps(state, ensure_ascii=False),
                     label["approve"], label["route"], label["risk"]])
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["id", "state", "approve", "route", "risk"])
        writer.writerows(rows)
    return len(rows)


# --- drift: a kind of claim the export never had ------------------------------------------------------------------
# A remote-work stipend: a share of the internet, power and the desk at home, claimed per month or per quarter.
HOME_OFFICE = "home_office"
STIPEND_PERIODS = {"monthly": 1, "quarterly": 3}  # period -> months
STIPEND_PER_MONTH = 80  # USD: the policy limit is this times the period's months
MIN_REMOTE_DAYS_PER_MONTH = 6  # fewer remote days a month of the period: ineligible (the README's drift rule)
HOME_ITEMS = ["internet", "electricity share", "heating share", "phone plan share", "desk lamp", "printer ink",
              "chair cushion", "webcam", "headset", "coworking day pass"]
# The notes: terse, bullet-like lines with the period and the remote days in them, a style no note of the export has.
HOME_NOTES = {
    "neutral": ["WFH stipend {period} // internet + power // {days} remote days per HR tracker",
                "home office {period}: connectivity + utilities share. remote days {days}.",
                "stipend claim {period} -- {days} days remote, items below, no changes vs last period",
                "[remote] {period} allowance; days: {days}; manager {person} aware",
                "home office costs {period} | remote {days}d | standard split 30% of the bills"],
    "benign": ["{period} stipend: bills were higher (winter heating) // {days} remote days",
               "home office {period}: new ISP contract, a bit pricier. remote days {days}.",
               "stipend {period} -- power prices went up this year, same flat as before, {days} remote days",
               "[remote] {period}: provider billed two months at once, both listed; days {days}"],
    "personal": ["{period} stipend // includes the family's streaming bundle + kids' tablet plan, {days} remote days",
                 "home office {period}: the new sofa is in here, I sit on it for calls. remote {days}d",
                 "[remote] {period}: partner's phone plan too, same bill; days {days}",
                 "stipend {period} -- holiday cottage internet, was off work that month mostly"],
    "duplicate": ["{period} stipend // already paid via payroll allowance, claiming the bills as well. {days}d",
                  "home office {period}: same bills as the claim from {person}'s team sheet, re-entered. remote {days}d",
                  "[remote] {period}: resubmitting, first stipend claim for this period shows as paid?",
                  "stipend {period} -- copy of HO-{n}, the portal lost the attachment"],
    "exception": ["{period} stipend above cap // {person} approved the extra in advance (HO-EX-{n}). {days}d",
                  "home office {period}: overage pre-approved by HR, ticket HR-{n}. remote days {days}.",
                  "[remote] {period}: ergonomic setup over the limit, signed off by {person} before buying; days {days}",
                  "stipend {period} -- finance okayed the higher amount beforehand, ref {n}. {days} remote"],
}


def make_home_office_claim(rng: random.Random, number: int) -> tuple[dict, dict]:
    """One home-office stipend claim and the hidden facts its labels are computed from (``labels``: the export's
    rule, plus ``ineligible``)."""
    level = pick(rng, LEVELS, LEVEL_WEIGHTS)
    signal = pick(rng, ["neutral", "benign", "personal", "duplicate", "exception"], [30, 22, 14, 13, 21])
    period = pick(rng, list(STIPEND_PERIODS), [60, 40])
    months = STIPEND_PERIODS[period]
    limit = STIPEND_PER_MONTH * months
    amount = round(limit * over_ratio(rng, signal, 0.3), 2)
    # about a third claim for too few remote days
    per_month = rng.randint(0, MIN_REMOTE_DAYS_PER_MONTH - 1) if rng.random() < 0.3 else rng.randint(
        MIN_REMOTE_DAYS_PER_MONTH, 21)
    remote_days = per_month * months + rng.randint(0, months - 1)
    ineligible = remote_days < MIN_REMOTE_DAYS_PER_MONTH * months
    receipt = rng.random() > 0.14
    days = rng.randint(1, 59) if rng.random() < 0.84 else (rng.randint(60, 90) if rng.random() < 0.5
                                                          else rng.randint(91, 240))
    prior = min(int(rng.expovariate(1 / 2.8)), 14)
    n_items = pick(rng, [1, 2, 2, 3, 3, 4])
    mismatch = rng.random() < 0.11
    item_total = amount * (rng.uniform(1.12, 1.6) if rng.random() < 0.5 else rng.uniform(0.4, 0.88)) if mismatch \
        else amount
    names = HOME_ITEMS[:]
    rng.shuffle(names)
    items = [{"description": names[i], "amount_usd": a}
             for i, a in enumerate(split_amount(rng, round(item_total, 2), n_items))]
    quarter = rng.randint(1, 4)
    label = f"Q{quarter} 2026" if period == "quarterly" else f"{pick(rng, MONTHS)} 2026"
    employee = {"level": level, "department": pick(rng, DEPARTMENTS)}
    if rng.random() < 0.93:
        employee["tenure_years"] = min(int(rng.expovariate(1 / 4)), 30)
    state = {"claim_id": f"HO-{20000 + number * 7 + rng.randrange(7)}",
             "submitted": f"2026-{rng.randint(9, 11):02d}-{rng.randint(1, 28):02d}",
             "employee": employee, "category": HOME_OFFICE, "amount_usd": amount,
             "policy_limit": {"amount_usd": limit, "basis": "per stipend period"},
             "stipend_period": period, "period": label, "remote_days": remote_days,
             "payment_method": pick(rng, PAYMENT), "receipt_attached": receipt, "days_since_expense": days,
             "items": items, "prior_claims_90d": prior}
    person = pick(rng, PEOPLE)
    state["note"] = pick(rng, HOME_NOTES[signal]).format(period=label, days=remote_days, person=person,
                                                         n=rng.randint(1000, 9999))
    facts = {"signal": signal, "ratio": amount / limit, "amount": amount, "receipt": receipt, "days": days,
             "prior": prior, "mismatch": abs(sum(i["amount_usd"] for i in items) - amount) > 0.05 * amount,
             "level": level, "ineligible": ineligible}
    return state, facts


def drift_claims(n: int, seed: int, noise: bool = True) -> list[tuple[dict, dict]]:
    """``n`` home-office claims as (state, labels) pairs, drawn from ``random.Random(seed)``: the same ``n`` and
    ``seed`` give the same claims. Labels by ``labels`` (the export's rule and the drift rule), then ``noisy`` (the
    export's label noise) unless ``noise`` is False."""
    rng, noise_rng = random.Random(f"home-office:{seed}"), random.Random(f"home-office-noise:{seed}")
    out = []
    for number in range(n):  # the noise has its own draw: with noise or without, the same claims
        state, facts = make_home_office_claim(rng, seed * 1000 + number)  # claim ids apart for each seed
        label = labels(facts)
        out.append((state, noisy(noise_rng, label) if noise else label))
    return out
