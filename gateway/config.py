"""The gateway's configuration file (``infra/tandem.yaml`` or ``--config``): tiers, registry, server, Ray."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.policy import GatewayPolicy
from infra.bundled import BUNDLED_REF
from infra.config import load_model_file
from serving.tiers import EngineConfig, TierConfig, default_tiers

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent.parent / "infra" / "tandem.yaml"


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Address the HTTP proxy binds to.")
    port: int = Field(8000, ge=1, le=65535)
    ingress_replicas: int = Field(1, ge=1, description="Replicas of the ingress (gateway) deployment.")
    shutdown_grace_s: float = Field(
        5.0,
        ge=0,
        description="On SIGTERM/Ctrl-C, how long in-flight requests get to finish before their streams are "
        "ended (the engines' own grace is each tier's graceful_shutdown_timeout_s).",
    )


class RayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None, description="Existing cluster to join ('auto', 'ray://...'); none starts one."
    )
    num_cpus: int = Field(
        8,
        ge=2,
        description="Logical CPUs for a local Ray: more than the cores, so the ingress and engines never "
        "starve for scheduling slots on a small machine.",
    )


class CanaryConfig(BaseModel):
    """A candidate release deployed beside the stable one; the rollout controller moves traffic to it."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="Candidate weights (registry ref); none: no candidate tiers.")
    draft: str | None = Field(
        None, description="Candidate fast-tier draft; default: its newest distilled draft."
    )
    weights_file: Path = Field(
        Path("rollout-state/weights.json"),
        description="Where `tandem rollout` publishes traffic weights (release/rollout.yaml traffic.weights_file).",
    )
    late_candidates: bool = Field(
        False,
        description="Without `model`: accept a candidate that `tandem rollout` (release.serve_deployer:ServeDeployer) "
        "deploys later as its own Serve applications, one per tier, leaving this application's replicas "
        "untouched. Starts Ray's dashboard and lets the deployer scale the stable tiers.",
    )

    @model_validator(mode="after")
    def _one_kind_of_candidate(self) -> CanaryConfig:
        if self.model and self.late_candidates:
            raise ValueError("late_candidates is for a gateway started without a candidate; drop one of them")
        return self


class TandemConfig(BaseModel):
    """Everything ``tandem serve`` needs. Tier fields left unset inherit ``model`` and ``engine`` from here."""

    model_config = ConfigDict(extra="forbid")

    registry: str | None = Field(
        None, description="Registry URL (file:// or s3://); default $TANDEM_REGISTRY."
    )
    model: str = Field(BUNDLED_REF, description="Weights every tier serves unless the tier names its own.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="Engine defaults for every tier.")
    tiers: list[TierConfig] = Field(default_factory=default_tiers)
    server: ServerConfig = Field(default_factory=ServerConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    canary: CanaryConfig = Field(default_factory=CanaryConfig, description="Optional candidate release.")
    gateway: GatewayPolicy = Field(
        default_factory=GatewayPolicy,
        description="Request bounds, auth, limits, routing, guardrails, telemetry.",
    )

    @model_validator(mode="after")
    def _inherit_and_check(self) -> TandemConfig:
        for tier in self.tiers:
            if "model" not in tier.model_fields_set:
                tier.model = self.model
            if "engine" not in tier.model_fields_set:
                tier.engine = self.engine.model_copy()
        names = [tier.name for tier in self.tiers]
        if names.count("standard") != 1:
            raise ValueError("tiers: exactly one tier named 'standard' is required")
        for name in ("fast", "long"):
            if names.count(name) > 1:
                raise ValueError(f"tiers: at most one tier named {name!r}")
        for tier in self.tiers:
            if tier.name == "long" and tier.context_extension is None:
                raise ValueError(
                    "tiers: the 'long' tier needs context_extension (e.g. {method: yarn, factor: 2})"
                )
        for name in self.gateway.upstreams:
            if name not in names:
                raise ValueError(f"gateway.upstreams.{name}: no tier named {name!r} is configured")
        seen: set[str] = set()
        for tier in self.tiers:
            for public in (tier.model_id, *tier.aliases):
                if public in seen:
                    raise ValueError(f"tiers: model id or alias {public!r} is used twice")
                seen.add(public)
        self._check_local_cpus()
        return self

    def _check_local_cpus(self) -> None:
        """A local Ray too small for the replicas would leave `tandem serve` waiting forever for a placement:
        refuse it up front. Each replica reserves its engine's num_cpus + 1 (Serve LLM's replica actor) and the
        ingress one more. (Candidate replicas are placed when a rollout scales them up, and checked then.)"""
        if self.ray.address is not None:
            return
        reserved = {tier.name: tier.replicas * (tier.num_cpus + 1) for tier in self.tiers}
        needed = sum(reserved.values()) + 1
        if needed > self.ray.num_cpus:
            parts = ", ".join(f"{name} {cpus:g}" for name, cpus in reserved.items())
            raise ValueError(
                f"ray.num_cpus={self.ray.num_cpus} cannot place the replicas: the tiers reserve {parts} CPUs "
                f"and the ingress 1; set ray.num_cpus to {int(needed + 0.999)} or more"
            )

    def tier(self, name: str) -> TierConfig | None:
        return next((tier for tier in self.tiers if tier.name == name), None)


def load_config(path: Path | None = None) -> TandemConfig:
    """Load ``path`` (default ``infra/tandem.yaml`` when it exists, else built-in defaults)."""
    if path is None:
        return (
            load_model_file(DEFAULT_CONFIG_PATH, TandemConfig)
            if DEFAULT_CONFIG_PATH.is_file()
            else TandemConfig()
        )
    return load_model_file(path, TandemConfig)
