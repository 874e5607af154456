"""``tandem review serve``: the blind-review web app (FastAPI, server-rendered HTML, a little vanilla JS).

Reviewers sign in with a gateway API key that carries the ``review`` scope; the app keeps only the key's id in
a signed, HttpOnly, SameSite=Strict cookie and re-checks the key (revoked, expired, scope) on every request.
Scripts may send ``Authorization: Bearer <key>`` instead. Pages answer errors as HTML, ``/api/`` as OpenAI-style
JSON (``{"error": {...}}``); a client mistake is a 4xx, never a 500.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal
from urllib.parse import parse_qs, quote

from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from itsdangerous import BadSignature, URLSafeTimedSerializer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from feedback.review.errors import NotSignedIn, ReviewError, ReviewScopeMissing
from feedback.review.pages import SCRIPT, STYLESHEET, render
from feedback.review.pairs import BlindPair
from feedback.review.store import MAX_REASON_CHARS, ReviewProgress, ReviewStore, open_review_store
from gateway.errors import GatewayError, error_response
from gateway.keys import REVIEW_SCOPE, KeyNotFound, KeyRecord, open_key_store

log = logging.getLogger(__name__)

COOKIE_NAME = "tandem_review"
SIGN_IN_MAX_AGE_S = 12 * 3600
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_HEADINGS = {400: "Bad request", 401: "Sign-in needed", 403: "Not allowed", 404: "Not found", 409: "Conflict"}


class VoteRequest(BaseModel):
    """``POST /api/pairs/{pair_id}/vote``."""

    model_config = ConfigDict(extra="forbid")

    choice: Literal["A", "B", "tie"] = Field(description="The better answer, or tie.")
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS, description="Why (optional).")


class NextPair(BaseModel):
    """``GET /api/sessions/{session_id}/next``: the reviewer's next blind pair, or done."""

    done: bool
    pair: BlindPair | None
    progress: ReviewProgress


class Reviewer(BaseModel):
    key_id: str
    name: str


def check_reviewer(record: KeyRecord | None) -> Reviewer:
    """The reviewer behind a key record: NotSignedIn for no, revoked or expired keys, ReviewScopeMissing
    (403) for a key without the ``review`` scope."""
    if record is None:
        raise NotSignedIn("Unknown API key. Sign in with a key created by `tandem keys create`.")
    if record.revoked:
        raise NotSignedIn(f"The API key {record.key_id}... has been revoked.")
    if record.is_expired():
        raise NotSignedIn(f"The API key {record.key_id}... has expired.")
    if REVIEW_SCOPE not in record.scopes:
        raise ReviewScopeMissing(
            f"The API key {record.key_id}... ({record.name}) does not carry the 'review' scope, so it cannot "
            f"review. Ask for a key with the review scope (`tandem keys create NAME --scope review`)."
        )
    return Reviewer(key_id=record.key_id, name=record.name)


def _safe_next(value: str | None) -> str:
    """A local path to return to after sign-in (never another site)."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/"


def build_review_app(database_url: str, *, secret: str | None = None) -> FastAPI:
    """The review app over the key database at ``database_url`` (the API keys and the review tables).

    ``secret`` signs the sign-in cookies (default: $TANDEM_REVIEW_SECRET, else a random one, so sign-ins end
    when the server restarts).
    """
    store: ReviewStore = open_review_store(database_url)
    keys = open_key_store(database_url)
    secret = secret or os.environ.get("TANDEM_REVIEW_SECRET")
    if not secret:
        log.warning("event=review_secret_random detail='sign-ins end when the server restarts'")
        secret = secrets.token_hex(32)
    signer = URLSafeTimedSerializer(secret, salt="tandem-review-sign-in")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()
        keys.close()

    app = FastAPI(
        title="Tandem blind review", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )

    # -- sign-in ------------------------------------------------------------------------------------
    def reviewer_of(request: Request) -> Reviewer:
        authorization = request.headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            return check_reviewer(keys.lookup(authorization[7:].strip()))
        cookie = request.cookies.get(COOKIE_NAME)
        if not cookie:
            raise NotSignedIn("Sign in with an API key that carries the review scope.")
        try:
            key_id = signer.loads(cookie, max_age=SIGN_IN_MAX_AGE_S)["key_id"]
        except (BadSignature, KeyError, TypeError) as exc:
            raise NotSignedIn("Your sign-in has expired or is invalid; sign in again.") from exc
        try:
            record = keys.get(key_id)
        except KeyNotFound:
            record = None
        return check_reviewer(record)

    # -- errors -------------------------------------------------------------------------------------
    def failure(request: Request, status: int, message: str, code: str | None, param: str | None = None,
                headers: dict[str, str] | None = None) -> Response:  # fmt: skip
        if request.url.path.startswith("/api/") or "application/json" in request.headers.get("accept", ""):
            return error_response(status, message, param=param, code=code, headers=headers)
        if status == 401 and request.method == "GET":
            return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
        page = render("error", title=_HEADINGS.get(status, "Error"), heading=_HEADINGS.get(status, "Error"),
                      message=message, status=status, reviewer=None)  # fmt: skip
        return HTMLResponse(page, status_code=status, headers=headers)

    async def on_review_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ReviewError)
        return failure(request, exc.status, str(exc), exc.code)

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)  # e.g. KeyStoreUnavailable: 503 with Retry-After
        return failure(request, exc.status, exc.message, exc.code, exc.param, getattr(exc, "headers", None))

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            return failure(request, 400, "The request body is not valid JSON.", "invalid_json")
        field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")) or None
        details = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in errors[:5]
        )
        return failure(request, 400, f"Invalid request: {details}", "invalid_parameter", field)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return failure(request, exc.status_code, str(exc.detail), None, headers=getattr(exc, "headers", None))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("event=review_unhandled_error path=%s", request.url.path)
        return failure(request, 500, "Internal server error.", "internal_error")

    app.add_exception_handler(ReviewError, on_review_error)
    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    # -- pages --------------------------------------------------------------------------------------
    @app.get("/healthz", include_in_schema=False)
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/static/review.js", include_in_schema=False)
    def script() -> Response:
        return Response(SCRIPT, media_type="text/javascript")

    @app.get("/static/review.css", include_in_schema=False)
    def stylesheet() -> Response:
        return Response(STYLESHEET, media_type="text/css")

    @app.get("/login", response_class=HTMLResponse)
    def login_page(next: str = "/") -> HTMLResponse:
        return HTMLResponse(
            render("login", title="Sign in", next=_safe_next(next), error=None, reviewer=None)
        )

    @app.post("/login")
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        plain = (form.get("api_key") or [""])[0].strip()
        target = _safe_next((form.get("next") or ["/"])[0])
        try:
            reviewer = check_reviewer(keys.lookup(plain) if plain else None)
        except NotSignedIn as exc:
            page = render("login", title="Sign in", next=target, error=str(exc), reviewer=None)
            return HTMLResponse(page, status_code=401)
        log.info("event=review_sign_in key_id=%s", reviewer.key_id)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE_NAME, signer.dumps({"key_id": reviewer.key_id}), max_age=SIGN_IN_MAX_AGE_S,
                            httponly=True, samesite="strict", secure=request.url.scheme == "https")  # fmt: skip
        return response

    @app.post("/logout")
    def logout() -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE_NAME)
        return response

    @app.get("/", response_class=HTMLResponse)
    def sessions_page(request: Request) -> HTMLResponse:
        reviewer = reviewer_of(request)
        page = render("sessions", title="Sessions", sessions=store.sessions(), reviewer=reviewer.name)
        return HTMLResponse(page)

    def pair_fragment(session_id: str, reviewer: Reviewer) -> str:
        pair = store.next_pair(session_id, reviewer.key_id)
        progress = store.progress(session_id, reviewer.key_id)
        return render(
            "pair", pair=pair.blind() if pair else None, progress=progress, max_reason=MAX_REASON_CHARS
        )

    @app.get("/sessions/{session_id}", response_class=HTMLResponse)
    def review_page(session_id: str, request: Request) -> HTMLResponse:
        reviewer = reviewer_of(request)
        session = store.session(session_id)
        fragment = pair_fragment(session_id, reviewer)
        return HTMLResponse(render("review", title=f"Session {session_id}", session=session, fragment=fragment,
                                   reviewer=reviewer.name))  # fmt: skip

    @app.get("/sessions/{session_id}/pair", response_class=HTMLResponse)
    def next_pair_fragment(session_id: str, request: Request) -> HTMLResponse:
        reviewer = reviewer_of(request)
        store.session(session_id)
        return HTMLResponse(pair_fragment(session_id, reviewer))

    # -- JSON API -----------------------------------------------------------------------------------
    @app.get("/api/sessions")
    def list_sessions(request: Request) -> list[dict[str, Any]]:
        reviewer_of(request)
        # Model names stay on the server: reviewers must not learn which answer is whose.
        return [s.model_dump(mode="json", include={"session_id", "set_ref", "n_pairs", "reviews_per_pair"})
                for s in store.sessions()]  # fmt: skip

    @app.get("/api/sessions/{session_id}/next")
    def next_pair(session_id: str, request: Request) -> NextPair:
        reviewer = reviewer_of(request)
        pair = store.next_pair(session_id, reviewer.key_id)
        return NextPair(done=pair is None, pair=pair.blind() if pair else None,
                        progress=store.progress(session_id, reviewer.key_id))  # fmt: skip

    @app.post("/api/pairs/{pair_id}/vote")
    def vote(pair_id: str, request: Request, payload: Any = Body(None)) -> JSONResponse:
        # Who and which pair come before what: a stranger gets 401/403 and a wrong pair 404 whatever the body.
        reviewer = reviewer_of(request)
        store.pair(pair_id)
        try:
            body = VoteRequest.model_validate(payload)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from exc
        stored = store.vote(pair_id, reviewer.key_id, body.choice, body.reason)
        return JSONResponse(
            {"pair_id": stored.pair_id, "choice": stored.choice, "reason": stored.reason,
             "voted_at": stored.voted_at.isoformat(), "next": f"/api/sessions/{stored.session_id}/next"}
        )  # fmt: skip

    app.state.review_store = store
    return app


def serve_review_app(
    database_url: str, host: str = "127.0.0.1", port: int = 8100, secret: str | None = None
) -> None:
    """Run the review app with uvicorn until interrupted."""
    import uvicorn

    app = build_review_app(database_url, secret=secret)
    log.info("event=review_serve host=%s port=%d", host, port)
    uvicorn.run(app, host=host, port=port, log_level="info")
