"""De-identification of captured traffic: personal data in prompts and answers becomes a typed placeholder.

Placeholders: ``<NAME>``, ``<EMAIL>``, ``<PHONE>``, ``<CARD>``, ``<ID>`` (IBANs, SSN-like numbers, UUIDs,
long digit runs, letter-prefixed account numbers), ``<IP>`` and ``<SECRET>`` (API keys).

Entity detection is Microsoft Presidio's analyzer (``presidio-analyzer``, a kept library), run on a blank
spaCy pipeline (a tokenizer only), so no model is downloaded: its pattern-and-checksum recognizers find phone
numbers (through ``phonenumbers``, Google's libphonenumber), Luhn-valid card numbers, checksum-valid IBANs,
US SSNs, UUIDs and IP addresses. What Presidio cannot do without a model, or only over the network, is
done with patterns here:

- person names: Presidio finds them only with an NER model (spaCy's ``en_core_web_*``), which cannot be
  downloaded here, so names are an honorific plus a capitalised word ("Dr. Okafor"), a self-introduction
  ("my name is ...", "I'm ...", a sign-off), or a common given name from :mod:`gateway.first_names` with an
  optional capitalised surname;
- e-mail addresses: Presidio's e-mail recognizer fetches the public-suffix list over the network, so the
  gateway's own e-mail pattern is used;
- IDs beyond Presidio's: SSN-shaped numbers it rejects as invalid, compact IBAN-like codes without a valid
  checksum, runs of 9 or more digits, and letter-prefixed numbers of 6 or more digits;
- the gateway's redaction patterns (``gateway.guardrails``, configured in ``gateway.guardrails.patterns``:
  API keys, e-mails, Luhn-valid cards by default), and the ``[REDACTED:<name>]`` markers that redaction
  already left in answers.

Overlapping findings resolve to the leftmost, then the longest, then the more specific kind. Ordinary text
(dates, times, versions, small numbers, words) is left alone.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from gateway.first_names import FIRST_NAMES
from gateway.guardrails import luhn_valid
from gateway.policy import RedactionPattern, default_redaction_patterns

log = logging.getLogger(__name__)

NAME, EMAIL, PHONE, CARD, ID, IP, SECRET = "NAME", "EMAIL", "PHONE", "CARD", "ID", "IP", "SECRET"
# The more specific kind wins a tie between two findings of the same span.
_PRIORITY = (SECRET, CARD, EMAIL, PHONE, IP, ID, NAME)
# Presidio entity -> placeholder kind (only these recognizers are loaded).
_PRESIDIO_KINDS = {
    "PHONE_NUMBER": PHONE,
    "CREDIT_CARD": CARD,
    "IBAN_CODE": ID,
    "US_SSN": ID,
    "UUID": ID,
    "IP_ADDRESS": IP,
}
# The gateway's redaction pattern names -> placeholder kind; any other configured name becomes its upper case.
_REDACTION_KINDS = {"api_key": SECRET, "email": EMAIL, "card_number": CARD}
_PHONE_REGIONS = ("US", "UK", "DE", "FR", "ES", "IT", "NL", "IN", "CA", "AU", "BR", "IL", "JP")

_APOSTROPHES = "'\u2019"  # ASCII and typographic
_CAPITALISED = rf"[A-Z][a-z]+(?:[{_APOSTROPHES}-][A-Za-z]+)?"
_SURNAME = rf"(?:\s+(?:(?:van|von|de|da|del|di|le|la|bin|al)\s+)?{_CAPITALISED})?"
_FIRST_NAMES = "|".join(sorted(FIRST_NAMES, key=len, reverse=True))
_PATTERNS: dict[str, list[tuple[regex.Pattern[str], Callable[[str], bool] | None]]] = {
    NAME: [
        (
            regex.compile(
                rf"\b(?:Mr|Mrs|Ms|Mx|Miss|Dr|Prof|Sir|Madam|Mme|Herr|Frau)\.?\s+{_CAPITALISED}{_SURNAME}"
            ),
            None,
        ),
        (
            regex.compile(
                rf"(?<=\b(?i:my name is|my name[{_APOSTROPHES}]s|i am|i[{_APOSTROPHES}]m|call me|signed|regards|cheers|thanks|"
                rf"sincerely),?\s+){_CAPITALISED}{_SURNAME}"
            ),
            None,
        ),
        (regex.compile(rf"\b(?:{_FIRST_NAMES})\b{_SURNAME}"), None),
    ],
    EMAIL: [(regex.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"), None)],
    CARD: [(regex.compile(r"\b\d(?:[ -]?\d){12,18}\b"), luhn_valid)],
    ID: [
        (regex.compile(r"\b\d{3}-\d{2}-\d{4}\b"), None),  # SSN-shaped
        (regex.compile(r"\b[A-Z]{2}\d{2}[A-Z0-9]{11,30}\b"), None),  # IBAN-like, checksum or not
        (regex.compile(r"\b\d{9,}\b"), None),  # long digit runs: account, order, national numbers
        (regex.compile(r"\b[A-Z]{1,4}-?\d{6,}\b"), None),  # letter-prefixed numbers: passports, accounts
    ],
}
_REDACTED_MARKER = regex.compile(r"\[REDACTED:([A-Za-z0-9_.-]+)\]")


@dataclass(frozen=True)
class Finding:
    """One piece of personal data: its span in the text and its placeholder kind."""

    start: int
    end: int
    kind: str


class Deidentifier:
    """Finds personal data in text and replaces it with ``<KIND>`` placeholders; thread-safe.

    ``patterns`` are the gateway's redaction patterns (default: ``default_redaction_patterns()``). Presidio
    and spaCy load on the first call (seconds), so build one per process and use it off the request path.
    """

    def __init__(self, patterns: Sequence[RedactionPattern] | None = None) -> None:
        self.redaction_patterns = [
            (_REDACTION_KINDS.get(p.name, p.name.upper()), regex.compile(p.regex), p.luhn)
            for p in (default_redaction_patterns() if patterns is None else patterns)
        ]
        self._analyzer: Any = None
        self._lock = threading.Lock()

    # -- text -----------------------------------------------------------------------------------------
    def findings(self, text: str) -> list[Finding]:
        """Every finding in ``text``, overlaps resolved (leftmost, then longest, then most specific)."""
        if not text:
            return []
        candidates = [*self._presidio(text), *self._pattern_findings(text)]
        candidates.sort(key=lambda f: (f.start, -(f.end - f.start), _rank(f.kind)))
        selected: list[Finding] = []
        for candidate in candidates:
            if not selected or candidate.start >= selected[-1].end:
                selected.append(candidate)
        return selected

    def text(self, text: str) -> str:
        """``text`` with every finding replaced by its placeholder (and redaction markers normalised)."""
        if not text:
            return text
        text = _REDACTED_MARKER.sub(
            lambda m: f"<{_REDACTION_KINDS.get(m.group(1), m.group(1).upper())}>", text
        )
        pieces, cursor = [], 0
        for finding in self.findings(text):
            pieces += [text[cursor : finding.start], f"<{finding.kind}>"]
            cursor = finding.end
        pieces.append(text[cursor:])
        return "".join(pieces)

    # -- chat structures ------------------------------------------------------------------------------
    def messages(self, messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """OpenAI chat messages with their text (content parts, names, tool-call arguments) de-identified."""
        cleaned = []
        for message in messages:
            out = dict(message)
            out["content"] = self._content(message.get("content"))
            for field in ("reasoning_content", "refusal"):
                if isinstance(message.get(field), str):
                    out[field] = self.text(message[field])
            if isinstance(message.get("name"), str):
                out["name"] = f"<{NAME}>"
            if message.get("tool_calls"):
                out["tool_calls"] = self.tool_calls(message["tool_calls"])
            cleaned.append(out)
        return cleaned

    def tool_calls(self, calls: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """OpenAI tool calls with the string values inside their JSON arguments de-identified (keys and
        structure kept, so a call still validates against its tool's schema)."""
        cleaned = []
        for call in calls:
            out = dict(call)
            function = dict(call.get("function") or {})
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except json.JSONDecodeError:
                    function["arguments"] = self.text(arguments)
                else:
                    function["arguments"] = json.dumps(self._values(parsed), ensure_ascii=False)
            elif isinstance(arguments, dict | list):
                function["arguments"] = json.dumps(self._values(arguments), ensure_ascii=False)
            out["function"] = function
            cleaned.append(out)
        return cleaned

    def tools(self, tools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Tool definitions with their descriptions de-identified; names and schemas are kept as they are."""
        return [self._descriptions(dict(tool)) for tool in tools]

    # -- internals ------------------------------------------------------------------------------------
    def _content(self, content: Any) -> Any:
        if isinstance(content, str):
            return self.text(content)
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    part = dict(part) | {"text": self.text(part["text"])}
                parts.append(part)
            return parts
        return content

    def _values(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self._values(item) for item in value]
        if isinstance(value, dict):
            return {key: self._values(item) for key, item in value.items()}
        return value

    def _descriptions(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._descriptions(item) for item in value]
        if isinstance(value, dict):
            return {
                key: self.text(item)
                if key == "description" and isinstance(item, str)
                else self._descriptions(item)
                for key, item in value.items()
            }
        return value

    def _pattern_findings(self, text: str) -> list[Finding]:
        found = []
        for kind, patterns in _PATTERNS.items():
            for pattern, check in patterns:
                for match in pattern.finditer(text):
                    if match.end() > match.start() and (check is None or check(match.group())):
                        found.append(Finding(match.start(), match.end(), kind))
        for kind, pattern, luhn in self.redaction_patterns:
            for match in pattern.finditer(text):
                if match.end() > match.start() and (not luhn or luhn_valid(match.group())):
                    found.append(Finding(match.start(), match.end(), kind))
        return found

    def _presidio(self, text: str) -> list[Finding]:
        analyzer = self._load()
        results = analyzer.analyze(text=text, language="en", entities=list(_PRESIDIO_KINDS))
        return [Finding(r.start, r.end, _PRESIDIO_KINDS[r.entity_type]) for r in results]

    def _load(self) -> Any:
        with self._lock:
            if self._analyzer is None:
                self._analyzer = _presidio_analyzer()
            return self._analyzer


def _rank(kind: str) -> int:
    return _PRIORITY.index(kind) if kind in _PRIORITY else len(_PRIORITY)


def _presidio_analyzer() -> Any:
    """Presidio's analyzer with only its offline pattern-and-checksum recognizers, on a blank spaCy pipeline."""
    import spacy
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import SpacyNlpEngine
    from presidio_analyzer.predefined_recognizers import (
        CreditCardRecognizer,
        IbanRecognizer,
        IpRecognizer,
        PhoneRecognizer,
        UsSsnRecognizer,
        UuidRecognizer,
    )

    class BlankSpacyEngine(SpacyNlpEngine):  # type: ignore[misc]
        """A tokenizer-only spaCy pipeline: the recognizers used here need tokens, not a trained model."""

        def load(self) -> None:
            self.nlp = {"en": spacy.blank("en")}  # type: ignore[assignment]

    engine = BlankSpacyEngine(models=[{"lang_code": "en", "model_name": "blank:en"}])
    engine.load()
    registry = RecognizerRegistry(supported_languages=["en"])
    recognizers = (
        PhoneRecognizer(supported_regions=_PHONE_REGIONS),
        CreditCardRecognizer(),
        IbanRecognizer(),
        UsSsnRecognizer(),
        UuidRecognizer(),
        IpRecognizer(),
    )
    for recognizer in recognizers:
        registry.add_recognizer(recognizer)
    log.info("event=deidentifier_loaded recognizers=%s", ",".join(type(r).__name__ for r in recognizers))
    return AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=["en"])
