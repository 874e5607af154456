"""The review page in a real headless browser (Debian's chromium + chromium-driver, driven by selenium).

A reviewer signs in with a review-scoped key, votes from the keyboard, and the vote lands in the database; a key
without the review scope is refused. Set ``TANDEM_REVIEW_SCREENSHOT=path.png`` to keep a screenshot of the page
(the README's picture is made that way).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from feedback.review.app import build_review_app
from feedback.review.store import ReviewStore, Vote
from tests.conftest import free_port
from tests.feedback.review.conftest import create_session, make_key

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 30


@pytest.fixture()
def review_server(database_url: str, review_store: ReviewStore) -> Iterator[str]:
    """The review app under uvicorn in a thread on a free port; yields its base URL once it answers."""
    import uvicorn

    create_session(review_store, "support-w49", n=2, reviews_per_pair=1)
    port = free_port()
    app = build_review_app(database_url, secret="browser-test")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="review-app", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + WAIT_S
    while True:  # poll readiness: the first answer of /healthz
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the review app did not start")
        time.sleep(0.05)
    yield base
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture()
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (make system-deps installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,1000", "--lang=en-US"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


def _until(driver: Any, condition: Callable[[Any], Any], message: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(condition, message)


def _votes_become(store: ReviewStore, count: int) -> list[Vote]:
    deadline = time.monotonic() + WAIT_S
    while len(votes := store.votes("support-w49")) < count:
        if time.monotonic() > deadline:
            pytest.fail(f"expected {count} stored votes, found {len(votes)}")
        time.sleep(0.05)
    return votes


def _press(driver: Any, keys: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).send_keys(keys).perform()


def _sign_in(driver: Any, base: str, key: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{base}/sessions/support-w49")
    field = _until(driver, lambda d: d.find_element(By.ID, "api-key"), "no sign-in form")
    assert driver.switch_to.active_element == field  # the key field has focus on arrival
    field.send_keys(key, Keys.ENTER)


def test_reviewer_votes_from_the_keyboard_and_the_vote_is_stored(
    browser: Any, review_server: str, database_url: str, review_store: ReviewStore, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    key = make_key(database_url, "alice", ["review"])
    _sign_in(browser, review_server, key)
    form = _until(browser, lambda d: d.find_element(By.ID, "vote-form"), "no pair after sign-in")
    first = browser.find_element(By.CSS_SELECTOR, "section.pair").get_attribute("data-pair-id")
    assert "tandem-candidate" not in browser.page_source and "tandem-baseline" not in browser.page_source
    unlabelled = browser.execute_script(
        "return [...document.querySelectorAll('input:not([type=hidden])')].filter(i => !i.labels.length).length"
    )
    assert unlabelled == 0  # every control has a label screen readers announce
    screenshot = tmp_path / "review-page.png"
    assert browser.save_screenshot(str(screenshot)) and screenshot.read_bytes()[:4] == b"\x89PNG"
    if target := os.environ.get("TANDEM_REVIEW_SCREENSHOT"):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(screenshot, target)

    _press(browser, "b")  # the shortcut votes "B is better" at once
    (vote,) = _votes_become(review_store, 1)
    assert (vote.pair_id, vote.choice, vote.reviewer, vote.reason) == (first, "B", key[:11], None)
    shown = "const pair = document.querySelector('section.pair'); return pair && pair.dataset.pairId"
    _until(browser, lambda d: d.execute_script(shown) not in (None, first), "the next pair did not load")
    assert (
        browser.switch_to.active_element.get_attribute("id") == "pair-heading"
    )  # focus moved to the new pair
    assert "Vote recorded: B is better." in browser.find_element(By.ID, "status").text
    del form

    # Typing in the reason box never votes, even the letters a, t and b; Enter without a choice asks for one.
    reason = browser.find_element(By.ID, "reason")
    reason.click()
    reason.send_keys("a bit terse", Keys.ENTER)
    _until(browser, lambda d: d.find_element(By.ID, "form-error").text, "no prompt to choose")
    assert "Choose A, Tie or B first" in browser.find_element(By.ID, "form-error").text
    assert len(review_store.votes("support-w49")) == 1
    focused = browser.switch_to.active_element
    assert focused.get_attribute("id") == "choice-A"  # focus went to the choices
    assert browser.execute_script("return getComputedStyle(document.activeElement).outlineStyle") == "solid"
    _press(browser, "t")
    votes = _votes_become(review_store, 2)
    assert (votes[-1].choice, votes[-1].reason) == ("tie", "a bit terse")
    _until(browser, lambda d: d.find_elements(By.ID, "done-heading"), "no done message")
    assert "All done" in browser.find_element(By.ID, "done-heading").text


def test_a_key_without_the_review_scope_is_refused_in_the_browser(
    browser: Any, review_server: str, database_url: str, review_store: ReviewStore
) -> None:
    from selenium.webdriver.common.by import By

    key = make_key(database_url, "inference-only", ["inference"])
    _sign_in(browser, review_server, key)
    alert = _until(browser, lambda d: d.find_element(By.CSS_SELECTOR, "[role=alert]"), "no refusal shown")
    assert "does not carry the 'review' scope" in alert.text
    assert browser.find_element(By.TAG_NAME, "h1").text == "Not allowed"
    assert not browser.find_elements(By.ID, "vote-form") and review_store.votes("support-w49") == []
