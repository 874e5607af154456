"""Errors of the blind-review tool; each carries the HTTP status the review app answers it with."""

from __future__ import annotations

from infra.errors import TandemError


class ReviewError(TandemError):
    """A review session could not be built, read or voted on."""

    status: int = 400
    code: str = "invalid_review_request"


class ReviewInputError(ReviewError):
    """The inputs of a session (logs, set, options) do not make a session."""

    code = "invalid_review_input"


class SessionNotFound(ReviewError):
    """No review session with that id exists."""

    status = 404
    code = "session_not_found"


class SessionExists(ReviewError):
    """Session ids are unique within a database."""

    status = 409
    code = "session_exists"


class PairNotFound(ReviewError):
    """No pair with that id exists (in that session)."""

    status = 404
    code = "pair_not_found"


class NotSignedIn(ReviewError):
    """401: no valid review sign-in (no cookie or key, an unknown, revoked or expired key)."""

    status = 401
    code = "not_signed_in"


class ReviewScopeMissing(ReviewError):
    """403: a valid key without the ``review`` scope."""

    status = 403
    code = "review_scope_required"
