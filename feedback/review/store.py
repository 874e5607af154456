"""Review sessions, pairs and votes in the gateway's key database (SQLite file or PostgreSQL).

The tables live beside the API keys (reviewers sign in with those keys) and are created here, idempotently. A
vote is keyed by pair and reviewer: voting again on a pair replaces the earlier vote. The next pair offered to
a reviewer is one they have not voted on, the least-voted first, until each pair has ``reviews_per_pair`` votes;
two reviewers asking at the same moment may both get a pair's last slot, so a pair can end with a vote extra.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from feedback.review.errors import PairNotFound, ReviewInputError, SessionExists, SessionNotFound
from feedback.review.pairs import CHOICES, Choice, ReviewPair, ReviewSession
from gateway.database import Database, open_database

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2000

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS tandem_review_sessions (
        session_id TEXT PRIMARY KEY,
        body TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS tandem_review_pairs (
        pair_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        body TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS tandem_review_pairs_session ON tandem_review_pairs (session_id, position)",
    """CREATE TABLE IF NOT EXISTS tandem_review_votes (
        pair_id TEXT NOT NULL,
        reviewer TEXT NOT NULL,
        session_id TEXT NOT NULL,
        choice TEXT NOT NULL,
        reason TEXT,
        voted_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (pair_id, reviewer)
    )""",
    "CREATE INDEX IF NOT EXISTS tandem_review_votes_session ON tandem_review_votes (session_id)",
]
# pg_advisory_xact_lock key serialising concurrent schema creation (the key store uses its own).
_SCHEMA_LOCK = 0x7A52


class Vote(BaseModel):
    """One reviewer's verdict on one pair, in blind terms."""

    session_id: str
    pair_id: str
    reviewer: str = Field(description="The reviewer's API key id.")
    choice: Choice
    reason: str | None = None
    voted_at: datetime


class ReviewProgress(BaseModel):
    """Where one reviewer and the whole session stand."""

    total_pairs: int
    voted_by_reviewer: int = Field(description="Pairs this reviewer has voted on.")
    left_for_reviewer: int = Field(description="Pairs still to be offered to this reviewer.")
    complete_pairs: int = Field(description="Pairs holding reviews_per_pair votes or more.")


def ensure_review_schema(database: Database) -> None:
    """Create the review tables if they are missing (safe to run from several processes at once)."""
    with database.schema_transaction(_SCHEMA_LOCK) as cursor:
        for statement in _SCHEMA:
            cursor.execute(statement)


def _time(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


class ReviewStore:
    """Sessions, pairs and votes over a :class:`gateway.database.Database`."""

    def __init__(self, database: Database) -> None:
        self.database = database
        ensure_review_schema(database)

    # -- sessions -----------------------------------------------------------------------------------
    def create_session(self, session: ReviewSession, pairs: list[ReviewPair]) -> ReviewSession:
        """Store a new session with its pairs; an existing id is refused with SessionExists."""
        if any(pair.session_id != session.session_id for pair in pairs):
            raise ReviewInputError(f"every pair must belong to session {session.session_id!r}")
        session = session.model_copy(update={"n_pairs": len(pairs)})
        p = self.database.param
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                f"SELECT 1 FROM tandem_review_sessions WHERE session_id = {p}", (session.session_id,)
            )
            if cursor.fetchone() is not None:
                raise SessionExists(
                    f"review session {session.session_id!r} already exists; choose another --session"
                )
            cursor.execute(
                f"INSERT INTO tandem_review_sessions (session_id, body, created_at) VALUES ({p}, {p}, {p})",
                (session.session_id, session.model_dump_json(), session.created_at.timestamp()),
            )
            for pair in pairs:
                cursor.execute(
                    f"INSERT INTO tandem_review_pairs (pair_id, session_id, position, body) VALUES ({p}, {p}, {p}, {p})",
                    (pair.pair_id, pair.session_id, pair.position, pair.model_dump_json()),
                )
        log.info("event=review_session_created session=%s set=%s pairs=%d", session.session_id,
                 session.set_ref, len(pairs))  # fmt: skip
        return session

    def session(self, session_id: str) -> ReviewSession:
        with self.database.transaction() as cursor:
            cursor.execute(
                f"SELECT body FROM tandem_review_sessions WHERE session_id = {self.database.param}",
                (session_id,),
            )
            row = cursor.fetchone()
        if row is None:
            known = ", ".join(s.session_id for s in self.sessions()[-10:]) or "none yet"
            raise SessionNotFound(f"no review session {session_id!r} (known: {known})")
        return ReviewSession.model_validate_json(row[0])

    def sessions(self) -> list[ReviewSession]:
        """Every session, oldest first."""
        with self.database.transaction() as cursor:
            cursor.execute("SELECT body FROM tandem_review_sessions ORDER BY created_at, session_id")
            rows = cursor.fetchall()
        return [ReviewSession.model_validate_json(row[0]) for row in rows]

    # -- pairs --------------------------------------------------------------------------------------
    def pairs(self, session_id: str) -> list[ReviewPair]:
        """The session's pairs in offering order (SessionNotFound for an unknown session)."""
        self.session(session_id)
        with self.database.transaction() as cursor:
            cursor.execute(
                f"SELECT body FROM tandem_review_pairs WHERE session_id = {self.database.param} ORDER BY position",
                (session_id,),
            )
            rows = cursor.fetchall()
        return [ReviewPair.model_validate_json(row[0]) for row in rows]

    def pair(self, pair_id: str, session_id: str | None = None) -> ReviewPair:
        """One pair; PairNotFound when no pair has that id (in ``session_id``, when given)."""
        with self.database.transaction() as cursor:
            cursor.execute(
                f"SELECT body FROM tandem_review_pairs WHERE pair_id = {self.database.param}", (pair_id,)
            )
            row = cursor.fetchone()
        pair = None if row is None else ReviewPair.model_validate_json(row[0])
        if pair is None or (session_id is not None and pair.session_id != session_id):
            where = f" in session {session_id!r}" if session_id else ""
            raise PairNotFound(f"no review pair {pair_id!r}{where}")
        return pair

    def next_pair(self, session_id: str, reviewer: str) -> ReviewPair | None:
        """The next pair for ``reviewer``: not yet voted by them, fewest votes first, below the quota."""
        session = self.session(session_id)
        p = self.database.param
        with self.database.transaction() as cursor:
            cursor.execute(
                f"""SELECT p.pair_id, COUNT(v.reviewer) AS n, MIN(p.position) AS position
                    FROM tandem_review_pairs p LEFT JOIN tandem_review_votes v ON v.pair_id = p.pair_id
                    WHERE p.session_id = {p} AND p.pair_id NOT IN
                        (SELECT pair_id FROM tandem_review_votes WHERE session_id = {p} AND reviewer = {p})
                    GROUP BY p.pair_id
                    HAVING COUNT(v.reviewer) < {p}
                    ORDER BY n, position LIMIT 1""",
                (session_id, session_id, reviewer, session.reviews_per_pair),
            )
            row = cursor.fetchone()
        return None if row is None else self.pair(row[0])

    def progress(self, session_id: str, reviewer: str) -> ReviewProgress:
        session = self.session(session_id)
        p = self.database.param
        with self.database.transaction() as cursor:
            cursor.execute(
                f"""SELECT p.pair_id, COUNT(v.reviewer),
                           SUM(CASE WHEN v.reviewer = {p} THEN 1 ELSE 0 END)
                    FROM tandem_review_pairs p LEFT JOIN tandem_review_votes v ON v.pair_id = p.pair_id
                    WHERE p.session_id = {p} GROUP BY p.pair_id""",
                (reviewer, session_id),
            )
            rows = cursor.fetchall()
        quota = session.reviews_per_pair
        return ReviewProgress(
            total_pairs=len(rows),
            voted_by_reviewer=sum(1 for _, _, mine in rows if mine),
            left_for_reviewer=sum(1 for _, n, mine in rows if not mine and n < quota),
            complete_pairs=sum(1 for _, n, _ in rows if n >= quota),
        )

    # -- votes --------------------------------------------------------------------------------------
    def vote(
        self,
        pair_id: str,
        reviewer: str,
        choice: str,
        reason: str | None = None,
        *,
        session_id: str | None = None,
    ) -> Vote:
        """Record ``reviewer``'s ``choice`` (A, B or tie) on a pair, replacing their earlier vote on it."""
        if choice not in CHOICES:
            raise ReviewInputError(f"invalid choice {choice!r} (allowed: {', '.join(CHOICES)})")
        reason = (reason or "").strip() or None
        if reason is not None and len(reason) > MAX_REASON_CHARS:
            raise ReviewInputError(
                f"the reason is {len(reason)} characters long; the limit is {MAX_REASON_CHARS}"
            )
        pair = self.pair(pair_id, session_id)
        now = time.time()
        p = self.database.param
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                f"""INSERT INTO tandem_review_votes (pair_id, reviewer, session_id, choice, reason, voted_at)
                    VALUES ({p}, {p}, {p}, {p}, {p}, {p})
                    ON CONFLICT (pair_id, reviewer) DO UPDATE SET
                        choice = excluded.choice, reason = excluded.reason, voted_at = excluded.voted_at""",
                (pair_id, reviewer, pair.session_id, choice, reason, now),
            )
        log.info("event=review_vote session=%s pair=%s reviewer=%s", pair.session_id, pair_id, reviewer)
        return Vote(session_id=pair.session_id, pair_id=pair_id, reviewer=reviewer, choice=choice,  # type: ignore[arg-type]
                    reason=reason, voted_at=_time(now))  # fmt: skip

    def votes(self, session_id: str) -> list[Vote]:
        """Every vote of the session (SessionNotFound for an unknown session), oldest first."""
        self.session(session_id)
        with self.database.transaction() as cursor:
            cursor.execute(
                f"""SELECT session_id, pair_id, reviewer, choice, reason, voted_at FROM tandem_review_votes
                    WHERE session_id = {self.database.param} ORDER BY voted_at, pair_id, reviewer""",
                (session_id,),
            )
            rows = cursor.fetchall()
        return [
            Vote(session_id=r[0], pair_id=r[1], reviewer=r[2], choice=r[3], reason=r[4], voted_at=_time(r[5]))
            for r in rows
        ]

    def close(self) -> None:
        self.database.close()


def open_review_store(url: str) -> ReviewStore:
    """The review store in the key database at ``url`` (a SQLite path or ``sqlite:///`` URL, or ``postgresql://``)."""
    return ReviewStore(open_database(url))
