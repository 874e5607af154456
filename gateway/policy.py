"""``GatewayPolicy``: every tunable of the gateway's request pipeline, in one typed config section.

The pipeline per request is bounds -> auth -> rate limit -> route -> call -> guardrails -> settle usage ->
telemetry; each stage reads its own sub-section here. Defaults are documented on the fields.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serving.tiers import TierName


def default_key_store_url() -> str:
    """``$TANDEM_HOME/gateway.db`` (default ``~/.cache/tandem/gateway.db``): a SQLite file."""
    home = Path(os.environ.get("TANDEM_HOME", "~/.cache/tandem")).expanduser()
    return str(home / "gateway.db")


class AuthPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["auto", "keys", "none"] = Field(
        "auto",
        description="'keys': every request needs an API key; 'none': no auth at all (refused on a "
        "non-loopback bind unless allow_unauthenticated_remote); 'auto': 'none' on loopback, else 'keys'.",
    )
    key_store: str | None = Field(
        None,
        description="Where keys and rate-limit buckets live: a SQLite file path (or sqlite:///path) or a "
        "postgresql:// URL. Default $TANDEM_HOME/gateway.db. Ingress replicas must share it.",
    )
    allow_unauthenticated_remote: bool = Field(
        False, description="Permit mode 'none' on a non-loopback bind (only behind another auth layer)."
    )

    def key_store_url(self) -> str:
        return self.key_store or default_key_store_url()


class LimitPolicy(BaseModel):
    """Defaults for keys created without their own limits; a key's own limits win."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(
        60, ge=1, description="Default requests per minute per key; None means unlimited."
    )
    tokens_per_minute: int | None = Field(
        100_000, ge=1, description="Default prompt + completion tokens per minute per key; None: unlimited."
    )


class RoutingPolicy(BaseModel):
    """How the ``auto`` tier picks, and when the fast tier spills to the standard tier."""

    model_config = ConfigDict(extra="forbid")

    auto_fast_max_tokens: int = Field(
        512,
        ge=1,
        description="'auto' sends a request to the fast tier when its max_tokens is at most this "
        "(short, latency-bound answers are where speculation pays).",
    )
    auto_fast_requires_stream: bool = Field(
        True, description="'auto' sends only streaming (interactive) requests to the fast tier."
    )
    spill_max_in_flight: int = Field(
        16,
        ge=1,
        description="Spill fast -> standard when the fast tier already has this many requests in flight "
        "(speculation slows down under high batch load).",
    )
    spill_ttft_s: float | None = Field(
        2.0, gt=0, description="Spill when the fast tier's moving-average time to first token exceeds this."
    )
    spill_tpot_s: float | None = Field(
        0.2,
        gt=0,
        description="Spill when the fast tier's moving-average time per output token exceeds this.",
    )
    ewma_alpha: float = Field(
        0.2, gt=0, le=1, description="Weight of the newest sample in the latency moving averages."
    )
    stale_after_s: float = Field(
        30.0,
        gt=0,
        description="A latency average with no sample for this long is ignored, so a tier spilled away "
        "from gets traffic (and fresh samples) again.",
    )


class RedactionPattern(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Label used in counters and in the replacement text.")
    regex: str = Field(description="Python regular expression of the text to redact.")
    luhn: bool = Field(False, description="Redact only matches whose digits pass the Luhn checksum.")
    max_length: int = Field(
        128,
        ge=1,
        le=4096,
        description="Longest text this pattern can match; streams keep this many characters back so a "
        "match split across chunks is still redacted.",
    )

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value


def default_redaction_patterns() -> list[RedactionPattern]:
    return [
        RedactionPattern(
            name="api_key",
            # OpenAI/Anthropic-style (sk-...), Tandem (tk-...), GitHub (ghp_...), AWS access key ids.
            regex=r"\b(?:sk|tk)-[A-Za-z0-9_-]{16,}|\bgh[pousr]_[A-Za-z0-9]{30,}|\bAKIA[0-9A-Z]{16}\b",
            max_length=128,
        ),
        RedactionPattern(
            name="email",
            regex=r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
            max_length=254,
        ),
        RedactionPattern(name="card_number", regex=r"\b\d(?:[ -]?\d){12,18}\b", luhn=True, max_length=40),
    ]


class GuardrailPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    redact_outputs: bool = Field(True, description="Redact the patterns below from model outputs.")
    patterns: list[RedactionPattern] = Field(default_factory=default_redaction_patterns)
    enforce_tool_allowlist: bool = Field(
        True, description="Replace tool calls outside a key's tool allowlist with an error."
    )


class TelemetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP collector base URL (e.g. http://otel-collector:4318); None exports nothing. "
        "Default $OTEL_EXPORTER_OTLP_ENDPOINT when set.",
    )
    service_name: str = Field("tandem-gateway", description="OTel resource service.name.")
    metric_export_interval_s: float = Field(15.0, gt=0, description="How often metrics are pushed.")

    def endpoint(self) -> str | None:
        return self.otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None


class CapturePolicy(BaseModel):
    """Opt-in traffic capture (``gateway.capture``): keys with a ``capture_rate`` above 0 have that fraction of
    their chat requests de-identified and stored in the key database, for `tandem traffic build-set`."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True,
        description="Master switch: false captures nothing whatever the keys' capture rates say.",
    )
    retention_days: float = Field(
        30.0, gt=0, description="Captured records older than this are deleted by the capture writer."
    )
    queue_size: int = Field(
        1000,
        ge=1,
        description="Exchanges waiting for the background writer; past it new ones are dropped (and counted), "
        "never waited for.",
    )
    purge_interval_s: float = Field(
        3600.0, gt=0, description="How often the writer deletes records past the retention limit."
    )


class RequestBounds(BaseModel):
    """Hard limits checked before anything else; violations are 400/413 naming the field."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(1_048_576, ge=1024, description="Largest request body (413 beyond).")
    max_tokens: int = Field(4096, ge=1, description="Largest max_tokens / max_completion_tokens.")
    max_n: int = Field(4, ge=1, description="Largest n (choices per request).")
    max_messages: int = Field(256, ge=1, description="Most chat messages in one request.")
    max_prompt_chars: int = Field(200_000, ge=1, description="Most characters of prompt text in total.")


class UpstreamPolicy(BaseModel):
    """An external OpenAI-compatible (or any litellm) endpoint that serves a tier while its local engine is
    down. The API key is read from an environment variable; it never belongs in the config file."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        description="litellm model string '<provider>/<model>': 'hosted_vllm/<name>' for a vLLM server, "
        "'openai/<name>' for OpenAI or any OpenAI-compatible server, or any other litellm provider.",
        pattern=r"^[A-Za-z0-9_.-]+/\S+$",
    )
    api_base: str | None = Field(
        None,
        description="Base URL of the upstream API (e.g. http://10.0.0.5:8000/v1); None: the provider's own.",
        pattern=r"^https?://\S+$",
    )
    api_key_env: str | None = Field(
        None,
        description="Name of the environment variable holding the upstream's API key; None sends none.",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
    )
    timeout_s: float = Field(
        60.0, gt=0, description="Request timeout given to litellm; an upstream slower than this is a 504."
    )
    cooldown_s: float = Field(
        30.0,
        gt=0,
        description="After the local tier's engine fails, its traffic goes straight to the upstream for "
        "this long; the next request after it tries the local engine again.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_key_in_file(cls, data: object) -> object:
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError(
                "api_key: keys do not belong in the config file; put the key in an environment variable "
                "and name that variable in `api_key_env`"
            )
        return data


class GatewayPolicy(BaseModel):
    """The ``gateway:`` section of the Tandem config."""

    model_config = ConfigDict(extra="forbid")

    auth: AuthPolicy = Field(default_factory=AuthPolicy)
    limits: LimitPolicy = Field(default_factory=LimitPolicy)
    routing: RoutingPolicy = Field(default_factory=RoutingPolicy)
    guardrails: GuardrailPolicy = Field(default_factory=GuardrailPolicy)
    telemetry: TelemetryPolicy = Field(default_factory=TelemetryPolicy)
    bounds: RequestBounds = Field(default_factory=RequestBounds)
    capture: CapturePolicy = Field(
        default_factory=CapturePolicy, description="Opt-in, per-key, de-identified traffic capture."
    )
    upstreams: dict[TierName, UpstreamPolicy] = Field(
        default_factory=dict,
        description="Per tier, an external upstream used when the tier's local engine is unhealthy; a tier "
        "without one fails over to the other local tier instead.",
    )

    @model_validator(mode="after")
    def _unique_pattern_names(self) -> GatewayPolicy:
        names = [pattern.name for pattern in self.guardrails.patterns]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"guardrails.patterns: duplicate names {duplicates}")
        return self


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'; wildcard binds (0.0.0.0, ::) are not loopback."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
