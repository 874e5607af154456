"""The review app's HTML (Jinja2 templates, auto-escaped), its stylesheet and its small script; no build step.

Kept in Python strings so the package needs no data files. The script only enhances the server-rendered page:
it submits votes as JSON, swaps in the next pair's server-rendered fragment and adds the keyboard shortcuts
(``a``, ``t``, ``b`` vote unless the reason box has focus; Enter submits the selected choice).
"""

from __future__ import annotations

from typing import Any

from jinja2 import DictLoader, Environment, select_autoescape

_LAYOUT = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }} - Tandem blind review</title>
<link rel="stylesheet" href="/static/review.css">
<script src="/static/review.js" defer></script>
</head>
<body>
<a class="skip-link" href="#main">Skip to content</a>
<header class="top">
  <a class="brand" href="/">Tandem blind review</a>
  {% if reviewer %}
  <span class="who">Signed in as <strong>{{ reviewer }}</strong></span>
  <form method="post" action="/logout" class="inline"><button type="submit">Sign out</button></form>
  {% endif %}
</header>
<main id="main" tabindex="-1">
{% block body %}{% endblock %}
</main>
</body>
</html>
"""

_LOGIN = """{% extends "layout" %}{% block body %}
<h1>Sign in to review</h1>
<p>Use an API key that carries the <code>review</code> scope.</p>
{% if error %}<p class="error" role="alert" id="login-error">{{ error }}</p>{% endif %}
<form method="post" action="/login" class="login">
  <input type="hidden" name="next" value="{{ next }}">
  <label for="api-key">API key</label>
  <input type="password" id="api-key" name="api_key" autocomplete="off" required autofocus
         {% if error %}aria-invalid="true" aria-describedby="login-error"{% endif %}>
  <button type="submit" id="sign-in">Sign in</button>
</form>
{% endblock %}"""

_SESSIONS = """{% extends "layout" %}{% block body %}
<h1>Review sessions</h1>
{% if sessions %}
<ul class="sessions">
{% for s in sessions %}
  <li><a href="/sessions/{{ s.session_id }}">{{ s.session_id }}</a>
      <span class="muted">set {{ s.set_ref }}, {{ s.n_pairs }} pairs, {{ s.reviews_per_pair }} reviews each</span></li>
{% endfor %}
</ul>
{% else %}
<p>No review sessions yet. Create one with <code>tandem review create</code>.</p>
{% endif %}
{% endblock %}"""

_REVIEW = """{% extends "layout" %}{% block body %}
<h1>Session {{ session.session_id }}</h1>
<p class="help" id="keys-help">Keyboard: <kbd>a</kbd> A is better, <kbd>t</kbd> tie, <kbd>b</kbd> B is better
(not while typing a reason); <kbd>Enter</kbd> submits the selected choice; <kbd>Tab</kbd> moves between controls.</p>
<div id="status" class="status" role="status" aria-live="polite"></div>
<div id="pair-region" data-fragment-url="/sessions/{{ session.session_id }}/pair">
{{ fragment | safe }}
</div>
{% endblock %}"""

_PAIR = """{% macro answer(slot, item) %}
<section class="answer" aria-labelledby="answer-{{ slot }}-heading">
  <h3 id="answer-{{ slot }}-heading">Answer {{ slot }}</h3>
  <pre class="content">{{ item.text }}</pre>
  {% if item.tool_calls %}<h4>Tool calls</h4><pre class="content tool-calls">{{ item.tool_calls | tojson(indent=2) }}</pre>{% endif %}
</section>
{% endmacro %}
{% if pair %}
<section class="pair" data-pair-id="{{ pair.pair_id }}" aria-labelledby="pair-heading">
  <h2 id="pair-heading" tabindex="-1">Pair {{ progress.voted_by_reviewer + 1 }}
    of {{ progress.voted_by_reviewer + progress.left_for_reviewer }}</h2>
  <section class="prompt" aria-labelledby="prompt-heading">
    <h3 id="prompt-heading">Prompt</h3>
    {% for message in pair.prompt %}
    <div class="message role-{{ message.role }}">
      <div class="role">{{ message.role }}</div>
      <pre class="content">{{ message.content }}</pre>
    </div>
    {% endfor %}
  </section>
  <div class="answers">
    {{ answer("A", pair.answer_a) }}
    {{ answer("B", pair.answer_b) }}
  </div>
  <form id="vote-form" class="vote" method="post" action="/api/pairs/{{ pair.pair_id }}/vote"
        aria-describedby="keys-help">
    <fieldset>
      <legend>Which answer is better?</legend>
      <span class="choice"><input type="radio" id="choice-A" name="choice" value="A" aria-keyshortcuts="a">
        <label for="choice-A">A is better <kbd>a</kbd></label></span>
      <span class="choice"><input type="radio" id="choice-tie" name="choice" value="tie" aria-keyshortcuts="t">
        <label for="choice-tie">Tie <kbd>t</kbd></label></span>
      <span class="choice"><input type="radio" id="choice-B" name="choice" value="B" aria-keyshortcuts="b">
        <label for="choice-B">B is better <kbd>b</kbd></label></span>
    </fieldset>
    <label for="reason">Reason (optional)</label>
    <input type="text" id="reason" name="reason" maxlength="{{ max_reason }}" autocomplete="off"
           aria-describedby="reason-help">
    <span id="reason-help" class="help">Shortcut keys are off while you type here; Enter submits.</span>
    <button type="submit" id="submit-vote">Submit vote</button>
    <p id="form-error" class="error" role="alert"></p>
  </form>
</section>
{% else %}
<section class="done" aria-labelledby="done-heading">
  <h2 id="done-heading" tabindex="-1">All done</h2>
  <p>No pairs are left for you in this session ({{ progress.voted_by_reviewer }} voted,
     {{ progress.complete_pairs }} of {{ progress.total_pairs }} pairs have all their reviews). Thank you!</p>
  <p><a href="/">Back to the sessions</a></p>
</section>
{% endif %}"""

_ERROR = """{% extends "layout" %}{% block body %}
<h1>{{ heading }}</h1>
<p class="error" role="alert">{{ message }}</p>
{% if status == 401 or status == 403 %}<p><a href="/login">Sign in with another key</a></p>
{% else %}<p><a href="/">Back to the sessions</a></p>{% endif %}
{% endblock %}"""

STYLESHEET = """
:root { --accent: #1a5fb4; --error: #a51d2d; --muted: #5e5c64; font-family: system-ui, sans-serif; }
body { margin: 0; line-height: 1.45; color: #1e1e1e; background: #fafafa; }
main { max-width: 1200px; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
main:focus { outline: none; }
.top { display: flex; gap: 1rem; align-items: center; padding: .6rem 1.5rem; background: #241f31; color: #fff; }
.top a, .top button { color: #fff; }
.brand { font-weight: bold; text-decoration: none; margin-right: auto; }
.inline { display: inline; }
.skip-link { position: absolute; left: -999px; }
.skip-link:focus { left: 1rem; top: 1rem; background: #fff; color: #000; padding: .4rem; z-index: 10; }
:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
h2:focus-visible { outline-offset: 4px; }
.muted, .help { color: var(--muted); font-size: .92em; }
.error { color: var(--error); font-weight: 600; }
.error:empty { display: none; }
.status { min-height: 1.4em; color: #26a269; font-weight: 600; }
pre.content { white-space: pre-wrap; word-break: break-word; margin: .3rem 0 0; font: inherit; }
pre.tool-calls { font-family: ui-monospace, monospace; font-size: .9em; }
.message { border-left: 4px solid #c0bfbc; padding: .3rem .8rem; margin: .5rem 0; background: #fff; }
.message.role-system { border-color: #986a44; }
.message.role-user { border-color: var(--accent); }
.message.role-assistant { border-color: #26a269; }
.message.role-tool { border-color: #9141ac; }
.role { font-weight: bold; text-transform: uppercase; font-size: .8em; letter-spacing: .05em; color: var(--muted); }
.answers { display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; margin: 1rem 0; }
@media (max-width: 800px) { .answers { grid-template-columns: 1fr; } }
.answer { background: #fff; border: 1px solid #c0bfbc; border-radius: 6px; padding: .6rem 1rem; }
.answer h3 { margin: 0; }
.vote fieldset { border: 1px solid #c0bfbc; border-radius: 6px; display: flex; gap: 1.5rem; flex-wrap: wrap; }
.vote legend { font-weight: bold; padding: 0 .3rem; }
.vote label[for=reason] { display: block; margin-top: .8rem; font-weight: 600; }
.vote #reason { width: min(40rem, 100%); padding: .4rem; font: inherit; }
.vote button, .login button { margin-top: .8rem; padding: .45rem 1.2rem; font: inherit; cursor: pointer;
              background: var(--accent); color: #fff; border: 0; border-radius: 4px; }
.top button { background: transparent; border: 1px solid #fff; border-radius: 4px; padding: .2rem .6rem; cursor: pointer; }
.login label { display: block; font-weight: 600; margin: .8rem 0 .2rem; }
.login input { padding: .4rem; font: inherit; width: min(30rem, 100%); }
kbd { border: 1px solid #9a9996; border-radius: 3px; padding: 0 .3em; font-size: .85em; background: #fff; }
"""

SCRIPT = """
(function () {
  "use strict";
  var LABELS = { A: "A is better", B: "B is better", tie: "Tie" };
  var KEYS = { a: "A", b: "B", t: "tie" };
  function region() { return document.getElementById("pair-region"); }
  function form() { return document.getElementById("vote-form"); }
  function typing(element) {
    if (!element) { return false; }
    var tag = element.tagName;
    return tag === "TEXTAREA" || element.isContentEditable ||
      (tag === "INPUT" && ["radio", "checkbox", "button", "submit"].indexOf(element.type) < 0);
  }
  function selected(voteForm) {
    var checked = voteForm.querySelector("input[name=choice]:checked");
    return checked ? checked.value : null;
  }
  function showError(voteForm, message) {
    var box = voteForm.querySelector("#form-error");
    if (box) { box.textContent = message; }
  }
  async function loadNext() {
    var target = region();
    var response = await fetch(target.dataset.fragmentUrl, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (response.redirected) { window.location.assign(response.url); return; }  // signed out meanwhile
    if (!response.ok) {
      document.getElementById("status").textContent = "Could not load the next pair (" + response.status + "); reload the page.";
      return;
    }
    target.innerHTML = await response.text();
    var heading = target.querySelector("h2");
    if (heading) { heading.focus(); }
  }
  async function submitVote(choice) {
    var voteForm = form();
    if (!voteForm || voteForm.dataset.busy) { return; }
    if (!choice) {
      showError(voteForm, "Choose A, Tie or B first (keys a, t, b).");
      voteForm.querySelector("input[name=choice]").focus();
      return;
    }
    voteForm.dataset.busy = "1";
    var reason = voteForm.querySelector("#reason").value;
    try {
      var response = await fetch(voteForm.action, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ choice: choice, reason: reason || null })
      });
      if (!response.ok) {
        var message = "The vote was not stored (" + response.status + ").";
        try { message = (await response.json()).error.message; } catch (ignored) { }
        showError(voteForm, message);
        delete voteForm.dataset.busy;
        return;
      }
    } catch (failure) {
      showError(voteForm, "The vote was not stored: the server cannot be reached.");
      delete voteForm.dataset.busy;
      return;
    }
    document.getElementById("status").textContent = "Vote recorded: " + LABELS[choice] + ".";
    await loadNext();
  }
  document.addEventListener("submit", function (event) {
    if (event.target && event.target.id === "vote-form") {
      event.preventDefault();
      submitVote(selected(event.target));
    }
  });
  document.addEventListener("keydown", function (event) {
    var voteForm = form();
    if (!voteForm || event.ctrlKey || event.metaKey || event.altKey || event.isComposing) { return; }
    if (typing(document.activeElement)) { return; }
    var key = (event.key || "").toLowerCase();
    if (KEYS[key]) {
      event.preventDefault();
      var radio = voteForm.querySelector("input[name=choice][value=" + KEYS[key] + "]");
      radio.checked = true;
      submitVote(KEYS[key]);
    } else if (key === "enter" && !(document.activeElement && document.activeElement.tagName === "BUTTON")) {
      event.preventDefault();
      submitVote(selected(voteForm));
    }
  });
})();
"""

_TEMPLATES = {
    "layout": _LAYOUT,
    "login": _LOGIN,
    "sessions": _SESSIONS,
    "review": _REVIEW,
    "pair": _PAIR,
    "error": _ERROR,
}
_environment = Environment(loader=DictLoader(_TEMPLATES), autoescape=select_autoescape(default=True))


def render(template: str, **values: Any) -> str:
    """Render one of the app's templates (layout, login, sessions, review, pair, error)."""
    return _environment.get_template(template).render(**values)
