"""De-identification of captured traffic: each entity kind becomes its placeholder; ordinary text stays."""

from __future__ import annotations

import json

import pytest

from gateway.deidentify import Deidentifier
from gateway.policy import RedactionPattern


@pytest.fixture(scope="module")
def clean() -> Deidentifier:
    # Presidio and spaCy load once per module (seconds).
    return Deidentifier()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # names: a given name (+ surname), an honorific, a self-introduction, a sign-off
        ("Please email the invoice to Alice Smith today.", "Please email the invoice to <NAME> today."),
        ("Dr. Okafor will call back.", "<NAME> will call back."),
        ("Hello, my name is Zbigniew Wrobel and I need help.", "Hello, my name is <NAME> and I need help."),
        ("Thanks for the help.\nRegards, Marguerite", "Thanks for the help.\nRegards, <NAME>"),
        # e-mail
        ("Write to jane.doe+billing@example.co.uk now", "Write to <EMAIL> now"),
        # phone numbers, US, UK and international
        ("Call +1 (415) 555-0132 after six", "Call <PHONE> after six"),
        ("The office line is 020 7946 0958.", "The office line is <PHONE>."),
        ("Reach Berlin on +49 30 901820.", "Reach Berlin on <PHONE>."),
        # card numbers: Luhn-valid ones only
        ("Charge 4111 1111 1111 1111 please", "Charge <CARD> please"),
        ("Card 5500-0000-0000-0004 expired", "Card <CARD> expired"),
        # IDs: SSN-like, IBAN (spaced, compact), UUID, long digit runs, letter-prefixed numbers
        ("SSN 536-22-1234 and 123-45-6789", "SSN <ID> and <ID>"),
        ("IBAN GB82 WEST 1234 5698 7654 32 for the refund", "IBAN <ID> for the refund"),
        ("Pay to DE89370400440532013000.", "Pay to <ID>."),
        ("Request 550e8400-e29b-41d4-a716-446655440000 failed", "Request <ID> failed"),
        ("Customer number 123456789012 is late", "Customer number <ID> is late"),
        ("Passport X12345678 and order ORD-1234567", "Passport <ID> and order <ID>"),
        # the gateway's own redaction: API keys; and network addresses
        ("use sk-abcdefghijklmnopqrstuvwx0123 for it", "use <SECRET> for it"),
        ("ssh into 10.20.30.40", "ssh into <IP>"),
    ],
)
def test_each_entity_kind_becomes_its_placeholder(clean: Deidentifier, text: str, expected: str) -> None:
    assert clean.text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Write a haiku about the sea.",
        "The meeting is at 10:30 on 2024-05-01; upgrade to version 3.11.2 and buy 12 apples.",
        "May I ask whether Will Power is a band? Mark the box and grace the page.",
        "Return JSON with the fields name, email and phone for the customer record.",
        "Sort 1234567 items in O(n log n); the year 2024 had 366 days.",
        "Card 4111 1111 1111 1112 fails the checksum.",  # not Luhn-valid: not a card
    ],
)
def test_ordinary_text_is_left_alone(clean: Deidentifier, text: str) -> None:
    assert clean.text(text) == text


def test_redaction_markers_in_answers_become_placeholders(clean: Deidentifier) -> None:
    assert clean.text("sent to [REDACTED:email] with [REDACTED:api_key]") == "sent to <EMAIL> with <SECRET>"


def test_configured_redaction_patterns_apply() -> None:
    custom = Deidentifier([RedactionPattern(name="ticket", regex=r"\bTCK#\d+\b")])
    assert custom.text("see TCK#42 for details") == "see <TICKET> for details"


def test_chat_structures_keep_their_shape(clean: Deidentifier) -> None:
    messages = [
        {"role": "system", "content": "You help Alice Smith."},
        {"role": "user", "name": "alice", "content": [{"type": "text", "text": "Mail bob@example.com"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "send_mail",
                        "arguments": json.dumps({"to": "bob@example.com", "n": 2}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "queued for bob@example.com"},
    ]
    cleaned = clean.messages(messages)
    assert cleaned[0]["content"] == "You help <NAME>."
    assert cleaned[1]["name"] == "<NAME>" and cleaned[1]["content"] == [
        {"type": "text", "text": "Mail <EMAIL>"}
    ]
    call = cleaned[2]["tool_calls"][0]
    assert call["id"] == "call_1" and call["function"]["name"] == "send_mail"
    assert json.loads(call["function"]["arguments"]) == {"to": "<EMAIL>", "n": 2}
    assert cleaned[3] == {"role": "tool", "tool_call_id": "call_1", "content": "queued for <EMAIL>"}
    assert messages[0]["content"] == "You help Alice Smith."  # the input is not modified

    tools = [
        {
            "type": "function",
            "function": {
                "name": "send_mail",
                "description": "Mail someone, e.g. carol@example.org",
                "parameters": {
                    "type": "object",
                    "properties": {"to": {"type": "string", "description": "like dave@example.org"}},
                    "required": ["to"],
                },
            },
        }
    ]
    (tool,) = clean.tools(tools)
    assert tool["function"]["name"] == "send_mail"
    assert tool["function"]["description"] == "Mail someone, e.g. <EMAIL>"
    assert tool["function"]["parameters"]["properties"]["to"] == {
        "type": "string",
        "description": "like <EMAIL>",
    }
    assert tool["function"]["parameters"]["required"] == ["to"]
