"""The per-request pipeline of the gateway, in order:
bounds -> auth -> rate limit -> route -> call -> guardrails -> settle usage -> telemetry (-> capture, for a
sampled chat request of a key that opted in: handed to a background writer once the answer is complete).

The ingress owns the HTTP surface; this module owns the policy decisions, so each stage stays a call to
one of the gateway's modules (keys, ratelimit, routing, guardrails, telemetry).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.canary import (
    CANDIDATE,
    SESSION_HEADER,
    STABLE,
    ReleaseSplitter,
    candidate_model_id,
    open_release_metrics,
)
from gateway.capture import TrafficCapture
from gateway.database import KeyStoreUnavailable
from gateway.deidentify import Deidentifier
from gateway.errors import GatewayError, ModelNotFound, error_body, raised_from, tier_failure_types
from gateway.guardrails import (
    OutputGuard,
    Redactor,
    check_request_bounds,
    check_requested_tools,
    prompt_chars,
)
from gateway.keys import KeyRecord, auth_required, open_key_store
from gateway.policy import GatewayPolicy
from gateway.ratelimit import RateLimiter, Reservation, estimate_tokens
from gateway.routing import AUTO, FAST, STANDARD, RequestFeatures, TierRouter, TierStats
from gateway.telemetry import GatewayTelemetry, RequestTrace
from gateway.upstream import CircuitBreaker, UpstreamClient, UpstreamError

log = logging.getLogger(__name__)

TIER_HEADER = "x-tandem-tier"
VERSION_HEADER = "x-tandem-version"
REASON_HEADER = "x-tandem-route-reason"
RELEASE_HEADER = "x-tandem-release"
AUTO_IDS = ("tandem-auto", "auto")
DEFAULT_COMPLETION_ESTIMATE = 256  # tokens reserved when a request names no max_tokens

EngineCall = Callable[[Any, Request], Awaitable[Response]]


@dataclass(frozen=True)
class TierTarget:
    name: str
    model_id: str
    aliases: tuple[str, ...]
    version: str
    release: str = STABLE


@dataclass(frozen=True)
class RequestContext:
    """One request's facts, shared by every attempt to answer it: its tier, a failover tier, an upstream."""

    body: Any
    request: Request
    call: EngineCall
    operation: str
    release: str
    trace: RequestTrace
    key: KeyRecord | None
    reservation: Reservation | None


def _engine_failed(exc: BaseException) -> bool:
    """A tier that died or is restarting (not a client mistake): worth one retry on its upstream or the
    other tier."""
    return raised_from(exc, tier_failure_types())


def _sticky_key(key: KeyRecord | None, request: Request) -> str:
    """Who a client is for the canary split: its API key, else its session header, else its address."""
    if key is not None:
        return key.key_id
    session = request.headers.get(SESSION_HEADER)
    if session:
        return session
    return request.client.host if request.client else "anonymous"


class RequestPipeline:
    """Everything the ingress does around one engine call, configured by a ``GatewayPolicy``."""

    def __init__(
        self,
        policy: GatewayPolicy,
        targets: list[TierTarget],
        *,
        host: str = "127.0.0.1",
        weights_file: str | None = None,
        late_candidates: bool = False,
    ) -> None:
        self.policy = policy
        self.targets = {t.name: t for t in targets if t.release == STABLE}
        self.candidates = {t.name: t for t in targets if t.release == CANDIDATE}
        # A candidate deployed after start (its own Serve applications) serves each stable tier's model id
        # plus the candidate suffix; its version is whatever the weights file says the candidate is.
        self.late_candidates = late_candidates and not self.candidates
        if self.late_candidates:
            targets = [
                *targets,
                *(
                    TierTarget(t.name, candidate_model_id(t.model_id), (), "", CANDIDATE)
                    for t in self.targets.values()
                ),
            ]
        self.names: dict[str, str] = {}
        # A candidate's own model ids pin that release (smoke tests before any traffic is split).
        self.pinned: dict[str, str] = {}
        for target in targets:
            for public in (target.model_id, *target.aliases):
                self.names[public] = target.name
                if target.release == CANDIDATE:
                    self.pinned[public] = CANDIDATE
        self.splitter = ReleaseSplitter(
            Path(weights_file) if weights_file else None,
            has_candidate=bool(self.candidates) or self.late_candidates,
        )
        self.release_metrics = open_release_metrics()
        if FAST in self.targets:
            for public in AUTO_IDS:
                self.names.setdefault(public, AUTO)
        self.auth_required = auth_required(policy, host)
        self.key_store = open_key_store(policy.auth.key_store_url()) if self.auth_required else None
        self.limiter = RateLimiter(self.key_store.database, policy.limits) if self.key_store else None
        self.router = TierRouter(policy.routing, tiers=frozenset(self.targets))
        self.stats = TierStats.from_policy(policy.routing)
        guard = policy.guardrails
        self.redactor = Redactor(guard.patterns) if guard.redact_outputs and guard.patterns else None
        self.telemetry = GatewayTelemetry(policy.telemetry)
        # Capture is per key, so only a gateway with keys can capture; its records live in the key database.
        self.capture: TrafficCapture | None = None
        if self.key_store is not None and policy.capture.enabled:
            self.capture = TrafficCapture(
                self.key_store.database,
                policy.capture,
                deidentifier=Deidentifier(guard.patterns),
                telemetry=self.telemetry,
            )
        self.upstreams: dict[str, UpstreamClient] = {
            tier: UpstreamClient(upstream) for tier, upstream in policy.upstreams.items()
        }
        # Local engines that failed recently, by model id: their tier's upstream answers until cooldown.
        self.breaker = CircuitBreaker()
        tier_failure_types()  # import the engine's exception types now, not in the first failing request

    def public_ids(self) -> list[str]:
        return sorted(self.names)

    def requested_tier(self, model: str | None) -> str:
        if model is None or model not in self.names:
            raise ModelNotFound(model, self.public_ids())
        return self.names[model]

    async def handle(
        self,
        body: Any,
        request: Request,
        call: EngineCall,
        operation: str,
    ) -> Response:
        payload = body.model_dump(exclude_unset=True)
        check_request_bounds(payload, self.policy.bounds)
        stream = bool(getattr(body, "stream", False))
        trace = self.telemetry.start_request(operation=operation, model=body.model, stream=stream)
        reservation: Reservation | None = None
        try:
            # Who is asking comes before what they ask for: an unknown key learns nothing about models.
            key = await self._authenticate(request)
            trace.set_key(key.key_id if key else None)
            requested = self.requested_tier(body.model)
            if key is not None:
                key.require_tier(requested)
            release = self.pinned.get(body.model) or self.splitter.release_for(_sticky_key(key, request))
            check_requested_tools(getattr(body, "tools", None), key.tools if key else None)
            if key is not None and self.limiter is not None:
                estimate = estimate_tokens(
                    prompt_chars(payload),
                    payload.get("max_completion_tokens") or payload.get("max_tokens"),
                    n=payload.get("n") or 1,
                    default_max_tokens=DEFAULT_COMPLETION_ESTIMATE,
                )
                reservation = await asyncio.to_thread(self.limiter.check, key, estimate)
            features = RequestFeatures(
                requested_tier=requested,
                max_tokens=getattr(body, "max_completion_tokens", None) or getattr(body, "max_tokens", None),
                stream=stream,
                allowed_tiers=frozenset(key.tiers) if key and key.tiers is not None else None,
            )
            decision = self.router.choose(features, self.stats.snapshot())
            context = RequestContext(body, request, call, operation, release, trace, key, reservation)
            response = await self._call_with_fallback(context, decision.tier, decision.reason)
            if self.capture is not None and operation == "chat":
                response = self.capture.tap(
                    response, key=key, request=request, payload=payload, model=body.model
                )
        except GatewayError as exc:
            trace.set_error(exc.status, exc.code or type(exc).__name__)
            trace.end()
            await self._settle(reservation, 0)
            raise
        except BaseException as exc:
            trace.set_error(500, type(exc).__name__)
            trace.end()
            await self._settle(reservation, 0)
            raise
        if reservation is not None:
            response.headers.update(reservation.headers())
        return response

    async def _authenticate(self, request: Request) -> KeyRecord | None:
        if self.key_store is None:
            return None
        return await asyncio.to_thread(
            self.key_store.authenticate, request.headers.get("authorization"), AUTO
        )

    def _target(self, release: str, tier: str) -> TierTarget:
        if release == CANDIDATE and self.late_candidates:
            return self.late_candidate(tier)
        return (self.candidates if release == CANDIDATE else self.targets).get(tier) or self.targets[tier]

    def late_candidate(self, tier: str) -> TierTarget:
        """The late-deployed candidate's target for ``tier``, versioned from the published weights."""
        spec = self.splitter.weights().releases.get("candidate")
        version = (spec.model + (f"+{spec.draft}" if spec.draft else "")) if spec else "candidate"
        return TierTarget(tier, candidate_model_id(self.targets[tier].model_id), (), version, CANDIDATE)

    async def _call_with_fallback(self, context: RequestContext, tier: str, reason: str) -> Response:
        """Call ``tier``'s engine; when it is dead, its upstream if it has one; when that fails too, or there
        is none, the other local tier (if the key may use it). When everything fails the client gets the
        upstream's error if one was tried (it says why the fallback failed), else the engine's."""
        upstream = self.upstreams.get(tier)
        engine = self._target(context.release, tier).model_id
        failure: Exception | None = None
        if upstream is None or not self.breaker.is_open(engine):
            try:
                return await self._call(context, tier, reason)
            except Exception as exc:
                if not _engine_failed(exc):
                    raise
                failure = exc
            if upstream is not None:
                self.breaker.trip(engine, upstream.policy.cooldown_s)
                log.warning(
                    "event=tier_failover from=%s to=upstream upstream=%s cooldown_s=%s error=%r",
                    tier,
                    upstream.policy.model,
                    upstream.policy.cooldown_s,
                    repr(failure)[:200],
                )
        if upstream is not None:
            try:
                return await self._call(context, tier, f"{tier}_unavailable_upstream", upstream)
            except UpstreamError as exc:
                failure = exc
        # standard and fast serve the same window and weights, so each stands in for the other; a long
        # tier's prompts fit nowhere else.
        other = {FAST: STANDARD, STANDARD: FAST}.get(tier)
        key = context.key
        assert failure is not None
        if other is None or other not in self.targets or not (key is None or key.allows_tier(other)):
            raise failure
        log.warning("event=tier_failover from=%s to=%s error=%r", tier, other, repr(failure)[:200])
        try:
            return await self._call(context, other, f"{tier}_unavailable")
        except Exception as exc:
            if isinstance(failure, UpstreamError) and _engine_failed(exc):
                raise failure from exc
            raise

    async def _call(
        self, context: RequestContext, tier: str, reason: str, upstream: UpstreamClient | None = None
    ) -> Response:
        """One attempt: the tier's local engine, or its ``upstream`` when given."""
        body, trace, key, reservation = context.body, context.trace, context.key, context.reservation
        target = self._target(context.release, tier)
        release = target.release
        version = upstream.version if upstream is not None else target.version
        trace.set_route(tier, version, reason)
        client_wants_usage = False
        update: dict[str, Any] = {"model": target.model_id}
        if getattr(body, "stream", False):
            options = getattr(body, "stream_options", None)
            client_wants_usage = bool(options and getattr(options, "include_usage", False))
            # Ask the engine for usage on every stream: it settles rate limits and feeds telemetry.
            update["stream_options"] = {"include_usage": True}
        # Re-validated rather than assigned, so nested fields keep their model types.
        body = type(body).model_validate(body.model_dump(exclude_unset=True) | update)
        in_flight = self.stats.begin(tier)

        def first_token() -> None:
            in_flight.first_token()
            trace.first_token()

        guard = OutputGuard(
            self.redactor,
            key.tools if key else None,
            on_first_token=first_token,
            forward_usage=client_wants_usage or not getattr(body, "stream", False),
        )
        try:
            if upstream is not None:
                response = await upstream.answer(body, context.operation)
            else:
                response = await context.call(body, context.request)
        except BaseException as exc:
            in_flight.finish(ok=False)
            status = getattr(exc, "status", None) or getattr(exc, "status_code", None) or 500
            self._record(release, tier, server_error=int(status) >= 500)
            raise
        headers = {
            TIER_HEADER: tier,
            VERSION_HEADER: version,
            REASON_HEADER: reason,
            RELEASE_HEADER: release,
        }
        if isinstance(response, StreamingResponse):
            return StreamingResponse(
                self._guarded_stream(response.body_iterator, guard, in_flight, trace, reservation, release),
                media_type="text/event-stream",
                headers=headers,
            )
        payload = json.loads(bytes(response.body))
        first_token()
        try:
            guarded = guard.guard_json(payload)
        except GatewayError:
            in_flight.finish(ok=False)
            # The engine did the work: charge it even though the answer is withheld.
            await self._settle(reservation, int((guard.usage or {}).get("total_tokens") or 0))
            raise
        usage = guarded.get("usage") or {}
        in_flight.finish(usage.get("completion_tokens"))
        self._record(release, tier, server_error=False, in_flight=in_flight)
        trace.set_usage_from(usage)
        trace.add_redactions(guard.counts)
        trace.end()
        await self._settle(reservation, int(usage.get("total_tokens") or 0))
        return JSONResponse(guarded, status_code=response.status_code, headers=headers)

    async def _guarded_stream(
        self,
        source: AsyncIterable[Any],
        guard: OutputGuard,
        in_flight: Any,
        trace: RequestTrace,
        reservation: Reservation | None,
        release: str,
    ) -> AsyncIterator[str]:
        ok = False
        try:
            async for piece in guard.guard_sse(source):
                yield piece
            # guard_sse ends a stream with a blocked tool call itself (error event + [DONE]).
            ok = guard.blocked_tool is None
            if not ok:
                trace.set_error(403, "tool_not_allowed")
        except GatewayError as exc:
            trace.set_error(exc.status, exc.code)
            yield f"data: {json.dumps(error_body(exc.status, exc.message, param=exc.param, code=exc.code))}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            usage = guard.usage or {}
            in_flight.finish(usage.get("completion_tokens"), ok=ok)
            self._record(release, in_flight.tier, server_error=False, in_flight=in_flight)
            trace.set_usage_from(usage)
            trace.add_redactions(guard.counts)
            trace.end()
            await self._settle(reservation, int(usage.get("total_tokens") or 0))

    def _record(self, release: str, tier: str, *, server_error: bool, in_flight: Any = None) -> None:
        if self.release_metrics is None:
            return
        self.release_metrics.record(
            release,
            tier,
            server_error=server_error,
            ttft_s=in_flight.ttft_s if in_flight is not None else None,
            tpot_s=in_flight.tpot_s() if in_flight is not None else None,
        )

    async def _settle(self, reservation: Reservation | None, actual_tokens: int) -> None:
        if reservation is None or self.limiter is None:
            return
        try:
            await asyncio.to_thread(self.limiter.record_usage, reservation, actual_tokens)
        except KeyStoreUnavailable:
            # The answer is already made: deliver it. The key stays charged its reservation (the estimate,
            # usually above what was used), so an outage never lets usage go unmetered.
            log.warning(
                "event=usage_settle_failed key_id=%s reserved_tokens=%d actual_tokens=%d",
                reservation.key_id,
                reservation.reserved_tokens,
                actual_tokens,
            )
