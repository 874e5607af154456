"""``tandem review create|serve|sessions|report|export``: blind review of candidate vs baseline answers.

A thin shell over :mod:`feedback.review`; light to import (the web app, statsmodels and the registry load inside
the commands).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from feedback.review.errors import ReviewInputError

if TYPE_CHECKING:
    from feedback.review.store import ReviewStore

console = Console()
review_app = typer.Typer(
    help="Blind review: reviewers compare candidate and baseline answers (A/B, names hidden); agreement, the "
    "gate's human-preference row and DPO preference pairs.",
    no_args_is_help=True,
)

Database = Annotated[
    str | None,
    typer.Option(
        "--database",
        envvar="TANDEM_KEY_STORE",
        help="The gateway's key database (SQLite path or postgresql:// URL); reviews are stored beside the keys. "
        "Default: the config's gateway.auth.key_store, else $TANDEM_HOME/gateway.db.",
    ),
]
Session = Annotated[str, typer.Option("--session", help="Review session id.")]


def _database_url(database: str | None) -> str:
    from gateway.keys_cli import key_store_url

    return key_store_url(database, None)


def _store(database: str | None) -> ReviewStore:
    from feedback.review.store import open_review_store

    return open_review_store(_database_url(database))


@review_app.command("create")
def create_command(
    set_ref: Annotated[
        str,
        typer.Option("--set", help="Registry ref of the traffic eval set, e.g. traffic-support@2026-w49."),
    ],
    candidate_logs: Annotated[
        Path, typer.Option("--candidate-logs", help="Inspect log dir of the candidate's traffic run.")
    ],
    baseline_logs: Annotated[
        Path, typer.Option("--baseline-logs", help="Inspect log dir of the baseline's traffic run.")
    ],
    session: Annotated[
        str | None, typer.Option("--session", help="Session id (default: derived from the set ref).")
    ] = None,
    reviews_per_pair: Annotated[int, typer.Option(min=1, help="Reviewers each pair is shown to.")] = 3,
    include_auto_scored: Annotated[
        bool, typer.Option("--include-auto-scored", help="Also pair items the set scored automatically.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of the per-pair A/B placement.")] = 0,
    database: Database = None,
) -> None:
    """Build a session from two traffic-family runs on the same set: one blind pair per item both answered."""
    from feedback.review.pairs import default_session_id, plan_session, read_traffic_answers

    session_id = session or default_session_id(set_ref)
    planned, pairs = plan_session(
        session_id,
        read_traffic_answers(candidate_logs),
        read_traffic_answers(baseline_logs),
        set_ref=set_ref,
        reviews_per_pair=reviews_per_pair,
        seed=seed,
        include_auto_scored=include_auto_scored,
        candidate_logs=str(candidate_logs),
        baseline_logs=str(baseline_logs),
    )
    store = _store(database)
    try:
        created = store.create_session(planned, pairs)
    finally:
        store.close()
    console.print(
        f"[green]created[/] review session [bold]{created.session_id}[/]: {created.n_pairs} pairs of "
        f"{created.set_ref}, {created.reviews_per_pair} reviews each. Serve it with `tandem review serve`."
    )


@review_app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8100,
    database: Database = None,
    secret: Annotated[
        str | None,
        typer.Option(
            envvar="TANDEM_REVIEW_SECRET", help="Signs sign-in cookies (default: random per start)."
        ),
    ] = None,
) -> None:
    """Serve the blind-review page; reviewers sign in with API keys that carry the review scope."""
    from feedback.review.app import serve_review_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    console.print(f"review page: http://{host}:{port}/ (sign in with a review-scoped API key)")
    serve_review_app(_database_url(database), host=host, port=port, secret=secret)


@review_app.command("sessions")
def sessions_command(database: Database = None) -> None:
    """List the review sessions and how far each has got."""
    store = _store(database)
    try:
        table = Table(title="review sessions")
        table.add_column("session", no_wrap=True)  # the id to copy into other commands: never broken
        for column in ("set", "pairs", "reviews/pair", "votes", "candidate", "baseline"):
            table.add_column(column, overflow="fold")
        for session in store.sessions():
            votes = len(store.votes(session.session_id))
            table.add_row(session.session_id, session.set_ref, str(session.n_pairs), str(session.reviews_per_pair),
                          str(votes), session.candidate_model, session.baseline_model)  # fmt: skip
    finally:
        store.close()
    console.print(table)


@review_app.command("report")
def report_command(
    session: Session,
    database: Database = None,
    reviewer_a: Annotated[
        str | None,
        typer.Option("--reviewer-a", help="Key id of a reviewer, for Cohen's kappa with --reviewer-b."),
    ] = None,
    reviewer_b: Annotated[
        str | None, typer.Option("--reviewer-b", help="Key id of the second reviewer.")
    ] = None,
) -> None:
    """Un-blinded result so far: win/tie/loss, win rate with its CI, agreement (Fleiss; Cohen for two reviewers)."""
    from feedback.review.agreement import cohens_kappa
    from feedback.review.results import summarise

    if (reviewer_a is None) != (reviewer_b is None):
        raise ReviewInputError("Cohen's kappa needs both --reviewer-a and --reviewer-b")
    store = _store(database)
    try:
        summary = summarise(store, session)
        cohen = (
            cohens_kappa(store.votes(session), reviewer_a, reviewer_b) if reviewer_a and reviewer_b else None
        )
    finally:
        store.close()
    table = Table(title=f"review session {summary.session_id} ({summary.set_ref})")
    table.add_column("field")
    table.add_column("value")
    rate = "n/a" if summary.win_rate is None else f"{summary.win_rate:.3f}"
    interval = "n/a" if summary.ci_low is None else f"[{summary.ci_low:.3f}, {summary.ci_high:.3f}]"
    kappa = "n/a" if summary.fleiss_kappa is None else f"{summary.fleiss_kappa:.3f}"
    for field, value in (
        ("candidate / baseline", f"{summary.candidate_model} / {summary.baseline_model}"),
        ("pairs reviewed", str(summary.n_pairs)),
        ("votes / reviewers", f"{summary.n_votes} / {summary.reviewers}"),
        ("candidate win / tie / loss (votes)", f"{summary.wins} / {summary.ties} / {summary.losses}"),
        ("win rate (ties half)", rate),
        (f"{summary.confidence:.0%} CI ({summary.ci_method})", interval),
        (f"Fleiss' kappa ({summary.kappa_pairs} pairs with >= 2 votes)", kappa),
    ):
        table.add_row(field, value)
    if cohen is not None:
        value = "n/a" if cohen.kappa is None else f"{cohen.kappa:.3f}"
        table.add_row(
            f"Cohen's kappa {cohen.reviewer_a} vs {cohen.reviewer_b} ({cohen.n_pairs} pairs)", value
        )
    console.print(table)


@review_app.command("export")
def export_command(
    session: Session,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the human-preference summary JSON here (for tandem gate)."),
    ] = None,
    pairs: Annotated[
        bool,
        typer.Option("--pairs", help="Publish majority preferences as registry artifact reviews-<session>."),
    ] = False,
    registry: Annotated[
        str | None, typer.Option(help="Registry URL for --pairs (default file registry).")
    ] = None,
    version: Annotated[
        str | None, typer.Option(help="Artifact version for --pairs (default: UTC time).")
    ] = None,
    database: Database = None,
) -> None:
    """Export the un-blinded result: the gate's summary file (--out) and/or DPO preference pairs (--pairs)."""
    from feedback.review.results import publish_preferences, summarise, write_summary

    if out is None and not pairs:
        raise ReviewInputError("nothing to export: give --out FILE and/or --pairs")
    store = _store(database)
    try:
        if out is not None:
            summary = summarise(store, session)
            write_summary(summary, out)
            rate = "n/a" if summary.win_rate is None else f"{summary.win_rate:.3f}"
            console.print(
                f"[green]wrote[/] {out}: {summary.n_pairs} pairs, {summary.n_votes} votes, win rate {rate}"
            )
        if pairs:
            manifest = publish_preferences(store, session, registry, version)
            console.print(
                f"[green]published[/] {manifest.ref} ({manifest.lineage.metrics['pairs']} pairs); train with "
                f"`tandem posttrain dpo --pairs reviews:{session}`"
            )
    finally:
        store.close()
