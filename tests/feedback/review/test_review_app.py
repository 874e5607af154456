"""The review app over HTTP (in process): sign-in, scope checks, voting, the done state and clear 4xx errors."""

from __future__ import annotations

from collections.abc import Iterator
from html import escape

import pytest
from fastapi.testclient import TestClient

from feedback.review.app import COOKIE_NAME, build_review_app
from feedback.review.pairs import ReviewPair
from feedback.review.store import ReviewStore
from tests.feedback.review.conftest import ANSWER_TEXT, BASELINE, CANDIDATE, create_session, make_key


@pytest.fixture()
def pairs(review_store: ReviewStore) -> list[ReviewPair]:
    return create_session(review_store, "support-w49", n=2, reviews_per_pair=1)[1]


@pytest.fixture()
def client(database_url: str, pairs: list[ReviewPair]) -> Iterator[TestClient]:
    with TestClient(build_review_app(database_url, secret="test-secret")) as test_client:
        yield test_client


def _sign_in(client: TestClient, key: str, next_path: str = "/") -> None:
    response = client.post("/login", data={"api_key": key, "next": next_path}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == next_path
    assert COOKIE_NAME in response.cookies


def _assert_blind(text: str) -> None:
    assert CANDIDATE not in text and BASELINE not in text and "candidate_slot" not in text


def test_reviewer_signs_in_sees_a_blind_pair_and_votes(
    client: TestClient, database_url: str, review_store: ReviewStore, pairs: list[ReviewPair]
) -> None:
    page = client.get("/sessions/support-w49", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/login?next=/sessions/support-w49"
    key = make_key(database_url, "alice", ["review"])
    _sign_in(client, key, "/sessions/support-w49")

    page = client.get("/sessions/support-w49")
    assert page.status_code == 200
    html = page.text
    first = pairs[0]
    assert f'data-pair-id="{first.pair_id}"' in html
    assert "How do I reset my password?" in html and ">system<" in html and ">user<" in html
    assert "Answer A" in html and "Answer B" in html
    assert escape(ANSWER_TEXT[CANDIDATE]) in html and escape(ANSWER_TEXT[BASELINE]) in html  # escaped text
    assert 'aria-keyshortcuts="a"' in html and '<label for="reason">' in html
    _assert_blind(html)
    assert "script-src 'self'" in page.headers["content-security-policy"]

    voted = client.post(f"/api/pairs/{first.pair_id}/vote", json={"choice": "B", "reason": "more helpful"})
    assert voted.status_code == 200, voted.text
    assert voted.json()["choice"] == "B"
    (vote,) = review_store.votes("support-w49")
    assert (vote.pair_id, vote.choice, vote.reason) == (first.pair_id, "B", "more helpful")
    assert vote.reviewer == key[:11]  # the key id, never the key

    following = client.get("/api/sessions/support-w49/next").json()
    assert following["done"] is False and following["pair"]["pair_id"] == pairs[1].pair_id
    _assert_blind(str(following))
    client.post(f"/api/pairs/{pairs[1].pair_id}/vote", json={"choice": "tie"})
    assert client.get("/api/sessions/support-w49/next").json()["done"] is True
    assert "All done" in client.get("/sessions/support-w49/pair").text
    listing = client.get("/api/sessions").json()
    assert listing == [{"session_id": "support-w49", "set_ref": "traffic-support@2026-w49", "n_pairs": 2,
                        "reviews_per_pair": 1}]  # fmt: skip


def test_a_key_without_the_review_scope_is_refused_with_403(client: TestClient, database_url: str) -> None:
    key = make_key(database_url, "app-only", ["inference"])
    page = client.post("/login", data={"api_key": key, "next": "/"}, follow_redirects=False)
    assert page.status_code == 403
    assert "does not carry the &#39;review&#39; scope" in page.text and COOKIE_NAME not in page.cookies
    api = client.get("/api/sessions/support-w49/next", headers={"Authorization": f"Bearer {key}"})
    assert api.status_code == 403
    assert api.json()["error"]["type"] == "permission_error"
    assert api.json()["error"]["code"] == "review_scope_required"
    assert "review" in api.json()["error"]["message"]


def test_unknown_keys_sessions_and_pairs_get_clear_4xx(
    client: TestClient, database_url: str, pairs: list[ReviewPair]
) -> None:
    wrong = client.post("/login", data={"api_key": "tk-not-a-key"}, follow_redirects=False)
    assert wrong.status_code == 401 and "Unknown API key" in wrong.text
    assert client.get("/api/sessions").status_code == 401
    key = make_key(database_url, "bob", ["review"])
    auth = {"Authorization": f"Bearer {key}"}

    missing_session = client.get("/api/sessions/nope/next", headers=auth)
    assert missing_session.status_code == 404
    assert missing_session.json()["error"] | {"message": None} == {
        "message": None, "type": "not_found_error", "param": None, "code": "session_not_found",
    }  # fmt: skip
    assert "no review session 'nope'" in missing_session.json()["error"]["message"]
    _sign_in(client, key)
    page = client.get("/sessions/nope")
    assert page.status_code == 404 and "no review session" in page.text

    missing_pair = client.post("/api/pairs/0123456789abcdef/vote", json={"choice": "A"}, headers=auth)
    assert missing_pair.status_code == 404
    assert missing_pair.json()["error"]["code"] == "pair_not_found"
    assert "0123456789abcdef" in missing_pair.json()["error"]["message"]

    bad_choice = client.post(f"/api/pairs/{pairs[0].pair_id}/vote", json={"choice": "C"}, headers=auth)
    assert bad_choice.status_code == 400 and bad_choice.json()["error"]["param"] == "choice"
    not_json = client.post(
        f"/api/pairs/{pairs[0].pair_id}/vote",
        content=b"{",
        headers=auth | {"Content-Type": "application/json"},
    )
    assert not_json.status_code == 400
    extra = client.post(
        f"/api/pairs/{pairs[0].pair_id}/vote", json={"choice": "A", "model": "x"}, headers=auth
    )
    assert extra.status_code == 400
    assert client.get("/api/nothing-here").status_code == 404


def test_a_revoked_key_loses_its_sign_in(client: TestClient, database_url: str) -> None:
    from gateway.keys import open_key_store

    key = make_key(database_url, "carol", ["review"])
    _sign_in(client, key)
    assert client.get("/api/sessions").status_code == 200
    keys = open_key_store(database_url)
    try:
        keys.revoke("carol")
    finally:
        keys.close()
    refused = client.get("/api/sessions")
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    client.cookies.set(COOKIE_NAME, "forged")
    assert client.get("/api/sessions").json()["error"]["code"] == "not_signed_in"
