"""Documents tasks: invoices, financial statements and contracts with tables and nested sections.

Questions ask for a field, a computed total, a cross-check between sections, or a fact hidden at a chosen
depth of a long contract (needle). Answers are scored by exact or numeric match (see ``verifier.py``).
"""

from __future__ import annotations

import random
from typing import Any

from evalsuite.families.documents.prompt import ANSWER_INSTRUCTION
from evalsuite.generators.base import CITIES, WORDS, Builder, Draft, company, person
from evalsuite.schema import Difficulty, TaskInstance

_PRODUCTS = ("Widget", "Bracket", "Sensor", "Cable", "Valve", "Panel", "Module", "Fitting", "Gasket", "Relay")
_SERVICES = ("Installation", "Calibration", "Support hours", "Training", "Audit", "Maintenance visit")
_SEGMENTS = ("Industrial", "Consumer", "Healthcare", "Energy", "Software", "Logistics")


def _money(value: float) -> str:
    return f"{value:,.2f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _invoice(rng: random.Random, difficulty: Difficulty) -> tuple[str, dict[str, str], dict[str, float]]:
    """Render an invoice; returns (text, fields, amounts)."""
    n_goods = {"easy": 3, "medium": 6, "hard": 10}[difficulty]
    goods = [
        (
            f"{rng.choice(_PRODUCTS)} {rng.choice(WORDS).upper()}-{rng.randrange(10, 99)}",
            rng.randrange(1, 40),
            rng.randrange(150, 99000) / 100,
        )
        for _ in range(n_goods)
    ]
    services = [
        (rng.choice(_SERVICES), rng.randrange(1, 12), rng.randrange(4000, 20000) / 100)
        for _ in range({"easy": 0, "medium": 2, "hard": 4}[difficulty])
    ]
    goods_sum = round(sum(round(q * p, 2) for _, q, p in goods), 2)
    services_sum = round(sum(round(q * p, 2) for _, q, p in services), 2)
    discount_pct = rng.choice((0, 5, 10)) if difficulty == "hard" else 0
    discount = round(services_sum * discount_pct / 100, 2)
    subtotal = round(goods_sum + services_sum - discount, 2)
    vat_rate = rng.choice((7, 19, 20, 21))
    vat = round(subtotal * vat_rate / 100, 2)
    fields = {
        "invoice number": f"INV-{rng.randrange(2025, 2027)}-{rng.randrange(10000, 99999)}",
        "issue date": f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
        "due date": f"2027-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
        "seller": company(rng),
        "buyer": company(rng),
        "buyer contact": person(rng),
    }
    parts = [
        f"# Invoice {fields['invoice number']}",
        f"Issue date: {fields['issue date']}  \nPayment due: {fields['due date']}  \nCurrency: EUR",
        "## 1. Parties",
        f"### 1.1 Seller\n{fields['seller']}, {rng.randrange(1, 200)} {rng.choice(WORDS).title()}strasse, {rng.choice(CITIES)}",
        f"### 1.2 Buyer\n{fields['buyer']}, {rng.choice(CITIES)}. Contact: {fields['buyer contact']}",
        "## 2. Line items",
        "### 2.1 Goods",
        _table(
            ["Item", "Qty", "Unit price", "Amount"],
            [[n, str(q), _money(p), _money(round(q * p, 2))] for n, q, p in goods],
        ),
    ]
    if services:
        parts += [
            "### 2.2 Services",
            _table(
                ["Service", "Hours", "Rate", "Amount"],
                [[n, str(q), _money(p), _money(round(q * p, 2))] for n, q, p in services],
            ),
        ]
        if discount_pct:
            parts.append(f"A discount of {discount_pct}% applies to the services in section 2.2 only.")
    amounts = {
        "goods": goods_sum,
        "services": services_sum,
        "subtotal": subtotal,
        "vat": vat,
        "total": round(subtotal + vat, 2),
        "vat_rate": float(vat_rate),
    }
    return "\n\n".join(parts), fields, amounts


def _invoice_summary(amounts: dict[str, float], stated_subtotal: float, with_total: bool) -> str:
    lines = [f"- Subtotal: {_money(stated_subtotal)}", f"- VAT rate: {amounts['vat_rate']:.0f}%"]
    if with_total:
        vat = round(stated_subtotal * amounts["vat_rate"] / 100, 2)
        lines += [f"- VAT: {_money(vat)}", f"- Total due: {_money(stated_subtotal + vat)}"]
    return "## 3. Summary\n\n" + "\n".join(lines)


def _statement(rng: random.Random, difficulty: Difficulty) -> tuple[str, dict[str, float], list[str]]:
    """Render a quarterly revenue statement; returns (text without summary, per-segment totals, segments)."""
    segments = rng.sample(_SEGMENTS, {"easy": 2, "medium": 4, "hard": 6}[difficulty])
    quarters = {s: [rng.randrange(100, 9000) * 1000 for _ in range(4)] for s in segments}
    name = company(rng)
    parts = [
        f"# {name}: annual report FY2026 (EUR)",
        "## 1. Overview",
        f"{name} operates {len(segments)} segments. All figures in EUR.",
        "## 2. Revenue",
        "### 2.1 Revenue by segment and quarter",
        _table(
            ["Segment", "Q1", "Q2", "Q3", "Q4"], [[s, *(f"{v:,}" for v in quarters[s])] for s in segments]
        ),
        "### 2.2 Costs",
        f"Operating costs were EUR {rng.randrange(1000, 9000) * 1000:,} across all segments.",
    ]
    totals = {s: float(sum(quarters[s])) for s in segments}
    totals.update({f"{s}|Q{i + 1}": float(v) for s in segments for i, v in enumerate(quarters[s])})
    return "\n\n".join(parts), totals, segments


def extract_field(rng: random.Random, difficulty: Difficulty) -> Draft:
    text, fields, amounts = _invoice(rng, difficulty)
    text += "\n\n" + _invoice_summary(amounts, amounts["subtotal"], with_total=True)
    field = rng.choice(sorted(fields))
    prompt = f"{text}\n\n---\nQuestion: what is the {field} on this invoice? {ANSWER_INSTRUCTION}"
    return Draft(
        task_type="extract_field",
        prompt=prompt,
        expected={"answer": fields[field], "match": "exact"},
        metadata={"doc": "invoice", "field": field},
    )


def compute_total(rng: random.Random, difficulty: Difficulty) -> Draft:
    if rng.random() < 0.5:
        text, _, amounts = _invoice(rng, difficulty)
        text += "\n\n" + _invoice_summary(amounts, amounts["subtotal"], with_total=False)
        question = (
            "what is the total amount due including VAT, in EUR?"
            if difficulty != "easy"
            else "what is the sum of the Amount column of the goods table (section 2.1), in EUR?"
        )
        answer = amounts["total"] if difficulty != "easy" else amounts["goods"]
        doc = "invoice"
    else:
        text, totals, segments = _statement(rng, difficulty)
        if difficulty == "hard":
            chosen = rng.sample(segments, 2)
            answer = totals[chosen[0]] + totals[chosen[1]]
            question = f"what was the combined FY2026 revenue of the {chosen[0]} and {chosen[1]} segments?"
        else:
            chosen = [rng.choice(segments)]
            answer = totals[chosen[0]]
            question = f"what was the full-year (Q1 to Q4) revenue of the {chosen[0]} segment?"
        doc = "statement"
    prompt = f"{text}\n\n---\nQuestion: {question} {ANSWER_INSTRUCTION}"
    return Draft(
        task_type="compute_total",
        prompt=prompt,
        expected={"answer": round(answer, 2), "match": "numeric", "tolerance": 0.01},
        metadata={"doc": doc},
    )


def cross_check(rng: random.Random, difficulty: Difficulty) -> Draft:
    text, _, amounts = _invoice(rng, difficulty)
    error = 0.0 if rng.random() < 0.4 else rng.choice((-1, 1)) * rng.randrange(100, 50000) / 100
    stated = round(amounts["subtotal"] + error, 2)
    text += "\n\n" + _invoice_summary(amounts, stated, with_total=True)
    prompt = (
        f"{text}\n\n---\nQuestion: cross-check the invoice. By how much does the Subtotal stated in section 3 "
        "differ from the subtotal implied by the line items in section 2 (including any discount)? Give "
        f"stated minus implied, in EUR, or 0 if they agree. {ANSWER_INSTRUCTION}"
    )
    return Draft(
        task_type="cross_check",
        prompt=prompt,
        expected={"answer": round(error, 2), "match": "numeric", "tolerance": 0.01},
        metadata={"doc": "invoice", "consistent": error == 0.0},
    )


_CLAUSES = (
    "The {a} shall deliver all {w} documentation within {n} business days of a written request.",
    "Notices under this section must be sent to the registered office of the {a} by recorded delivery.",
    "The {a} shall maintain records relating to {w} services for at least {n} years.",
    "Neither party may assign its rights under clause {n} without the prior written consent of the other.",
    "Any change to the {w} schedule requires a change order signed by both parties.",
    "The {a} shall comply with all applicable laws concerning {w} data and export control.",
    "Acceptance tests for the {w} deliverables shall be completed within {n} days of delivery.",
)
_NEEDLES = (
    ("liability cap", "The aggregate liability of the Supplier under this Agreement is capped at EUR {v:,}."),
    ("annual service fee", "The Customer shall pay an annual service fee of EUR {v:,}, invoiced in advance."),
    ("termination fee", "Early termination by the Customer triggers a termination fee of EUR {v:,}."),
    ("insurance cover", "The Supplier shall hold professional indemnity insurance cover of EUR {v:,}."),
)


def needle(rng: random.Random, difficulty: Difficulty) -> Draft:
    n_clauses = {"easy": 12, "medium": 60, "hard": 180}[difficulty]
    depth = rng.choice((0.1, 0.25, 0.5, 0.75, 0.9))
    needle_index = min(n_clauses - 1, int(depth * n_clauses))
    target_label, target_text = rng.choice(_NEEDLES)
    value = rng.randrange(10, 5000) * 1000
    distractors = [n for n in _NEEDLES if n[0] != target_label] if difficulty == "hard" else []
    parts = [f"# Master services agreement between {company(rng)} (Supplier) and {company(rng)} (Customer)"]
    distractor_slots = set(rng.sample(range(n_clauses), len(distractors)))
    distractor_iter = iter(distractors)
    for i in range(n_clauses):
        if i % 6 == 0:
            parts.append(f"## {i // 6 + 1}. {rng.choice(WORDS).title()} provisions")
        number = f"{i // 6 + 1}.{i % 6 + 1}"
        if i == needle_index:
            sentence = target_text.format(v=value)
        elif i in distractor_slots:
            sentence = next(distractor_iter)[1].format(v=rng.randrange(10, 5000) * 1000)
        else:
            sentence = rng.choice(_CLAUSES).format(
                a=rng.choice(("Supplier", "Customer")), w=rng.choice(WORDS), n=rng.randrange(2, 90)
            )
        parts.append(f"{number} {sentence}")
    prompt = (
        "\n\n".join(parts)
        + f"\n\n---\nQuestion: what is the {target_label} stated in this agreement, in EUR? {ANSWER_INSTRUCTION}"
    )
    return Draft(
        task_type="needle",
        prompt=prompt,
        expected={"answer": float(value), "match": "numeric", "tolerance": 0.5},
        metadata={"doc": "contract", "depth": depth, "clauses": n_clauses},
    )


BUILDERS: dict[str, Builder] = {
    "extract_field": extract_field,
    "compute_total": compute_total,
    "cross_check": cross_check,
    "needle": needle,
}


def _render_answer(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.2f}"
    return str(value)


def reference_answer(instance: TaskInstance) -> str:
    """The right completion for an instance: its expected value on an ``ANSWER:`` line."""
    return f"ANSWER: {_render_answer(instance.expected['answer'])}"
