"""Render a :class:`GateVerdict` as Markdown and as a self-contained HTML page with per-family charts."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from evalsuite.gate import GateCheck, GateVerdict


def _row(check: GateCheck) -> str:
    c, h = check.comparison, check.preference
    if c:
        stats = (
            f"{c.n} | {c.mean_a:.3f} | {c.mean_b:.3f} | {c.diff:+.3f} | [{c.ci_low:+.3f}, {c.ci_high:+.3f}] | "
            f"{c.discordant_a_only}/{c.discordant_b_only} (p={c.mcnemar_p:.3g})"
        )
    elif h and h.win_rate is not None and h.ci_low is not None and h.ci_high is not None:
        stats = f"{h.n_pairs} | {h.win_rate:.3f} | 0.500 | {h.win_rate - 0.5:+.3f} | [{h.ci_low:.3f}, {h.ci_high:.3f}] | -"
    else:
        stats = "- | - | - | - | - | -"
    return (
        f"| {'PASS' if check.passed else 'FAIL'} | {check.name} | {check.kind} | {stats} | {check.reason} |"
    )


def render_markdown(verdict: GateVerdict) -> str:
    """The report as Markdown: verdict, one table row per check, and the policy used."""
    failed = [c for c in verdict.checks if not c.passed]
    lines = [
        f"# Release gate: {'PASS' if verdict.passed else 'FAIL'}",
        "",
        f"Candidate models: {', '.join(verdict.candidate_models)}; baseline models: "
        f"{', '.join(verdict.baseline_models)}; metric: `{verdict.policy.metric}`; confidence "
        f"{verdict.policy.confidence:.0%} (paired bootstrap, {verdict.policy.bootstrap_resamples} resamples).",
        "",
        "## Why" if failed else "## All checks passed",
        *[f"- **{c.name}**: {c.reason}" for c in failed],
        "",
        "| result | check | kind | n | a | b | a - b | CI | McNemar a-only/b-only | reason |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[_row(c) for c in verdict.checks],
        "",
        "a = candidate (parity: fast tier), b = baseline (parity: standard tier); human preference: a = the "
        "candidate's blind-review win rate (ties half), b = 0.5, CI = the win rate's (bootstrap over pairs).",
        *_preference_markdown(verdict),
    ]
    return "\n".join(lines) + "\n"


def _kappa(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _preference_markdown(verdict: GateVerdict) -> list[str]:
    """The human-preference section: one row per blind-review summary the gate read."""
    rows = [c for c in verdict.checks if c.kind == "human_preference"]
    if not rows:
        return []
    lines = ["", "## Human preference (blind review)", "",
             "| result | session | pairs | votes | reviewers | win rate | CI | Fleiss kappa | pass at |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for check in rows:
        h = check.preference
        if h is None:
            lines.append(f"| {'PASS' if check.passed else 'FAIL'} | - | - | - | - | - | - | - | - |")
            continue
        rate = "-" if h.win_rate is None else f"{h.win_rate:.3f}"
        ci = "-" if h.ci_low is None or h.ci_high is None else f"[{h.ci_low:.3f}, {h.ci_high:.3f}]"
        lines.append(f"| {'PASS' if check.passed else 'FAIL'} | {h.session_id} | {h.n_pairs} | {h.n_votes} | "
                     f"{h.reviewers} | {rate} | {ci} | {_kappa(h.fleiss_kappa)} | CI low >= {h.threshold:.3f} |")  # fmt: skip
    return lines


def _label(check: GateCheck) -> str:
    if check.kind == "parity":
        return "fast vs standard"
    return check.name.split("[", 1)[-1].rstrip("]") if "[" in check.name else check.name


def _chart(checks: list[GateCheck], family: str) -> str:
    """PNG (base64) for one family: success rates side by side, and a - b with its CI against the margin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [c for c in checks if c.comparison is not None]
    height = 1.2 + 0.55 * max(1, len(rows))
    figure, (rates, diffs) = plt.subplots(1, 2, figsize=(10, height), gridspec_kw={"width_ratios": [1, 1.4]})
    labels = [_label(c) for c in rows]
    for index, check in enumerate(rows):
        comparison = check.comparison
        assert comparison is not None
        rates.barh(
            index + 0.2,
            comparison.mean_a,
            height=0.4,
            color="tab:blue",
            label="a: candidate / fast" if index == 0 else None,
        )
        rates.barh(
            index - 0.2,
            comparison.mean_b,
            height=0.4,
            color="tab:grey",
            label="b: baseline / standard" if index == 0 else None,
        )
        colour = "tab:green" if check.passed else "tab:red"
        error = [[comparison.diff - comparison.ci_low], [comparison.ci_high - comparison.diff]]
        diffs.errorbar(comparison.diff, index, xerr=error, fmt="o", color=colour, capsize=4)
        diffs.plot(
            [-check.margin] * 2, [index - 0.4, index + 0.4], color="black", linestyle="--", linewidth=1
        )
        if check.kind == "parity":
            diffs.plot(
                [check.margin] * 2, [index - 0.4, index + 0.4], color="black", linestyle="--", linewidth=1
            )
    rates.set_yticks(range(len(rows)), labels)
    rates.set_xlim(0, 1)
    rates.set_xlabel("success rate")
    rates.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncols=2, fontsize="small", frameon=False)
    diffs.axvline(0, color="grey", linewidth=0.6)
    diffs.set_yticks(range(len(rows)), [""] * len(rows))
    diffs.set_xlabel("a - b with CI (dashed: margin)")
    figure.suptitle(family)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _html_effect(check: GateCheck) -> str:
    """The a - b cell: the paired difference, or for the human-preference row the win rate and its CI."""
    if check.comparison:
        return f"{check.comparison.diff:+.3f}"
    h = check.preference
    if h and h.win_rate is not None and h.ci_low is not None and h.ci_high is not None:
        return f"win rate {h.win_rate:.3f} [{h.ci_low:.3f}, {h.ci_high:.3f}], kappa {_kappa(h.fleiss_kappa)}"
    return "-"


def render_html(verdict: GateVerdict) -> str:
    """A self-contained page: verdict banner, reasons, a chart per family (embedded PNG), the table."""
    families = sorted({c.family for c in verdict.checks if c.comparison is not None})
    charts = "".join(
        f'<h3>{html.escape(f)}</h3><img alt="{html.escape(f)}" src="data:image/png;base64,'
        f'{_chart([c for c in verdict.checks if c.family == f], f)}"/>'
        for f in families
    )
    rows = "".join(
        f"<tr class={'pass' if c.passed else 'fail'}><td>{'PASS' if c.passed else 'FAIL'}</td>"
        f"<td>{html.escape(c.name)}</td><td>{c.kind}</td>"
        f"<td>{c.comparison.n if c.comparison else c.preference.n_pairs if c.preference else '-'}</td>"
        f"<td>{_html_effect(c)}</td>"
        f"<td>{html.escape(c.reason)}</td></tr>"
        for c in verdict.checks
    )
    reasons = "".join(f"<li><b>{html.escape(c.name)}</b>: {html.escape(c.reason)}</li>"
                      for c in verdict.checks if not c.passed)  # fmt: skip
    status = "PASS" if verdict.passed else "FAIL"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Release gate: " + status + "</title><style>"
        "body{font-family:sans-serif;max-width:960px;margin:2em auto}.banner{padding:.6em 1em;color:#fff;"
        "font-size:1.4em}.PASS{background:#2a7d2a}.FAIL{background:#b22222}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px}tr.fail td:first-child{color:#b22222;font-weight:bold}"
        "tr.pass td:first-child{color:#2a7d2a}</style></head><body>"
        f"<div class='banner {status}'>Release gate: {status}</div>"
        f"<p>Candidate: {html.escape(', '.join(verdict.candidate_models))}; baseline: "
        f"{html.escape(', '.join(verdict.baseline_models))}; metric {verdict.policy.metric}.</p>"
        + (f"<h2>Why it failed</h2><ul>{reasons}</ul>" if reasons else "<h2>All checks passed</h2>")
        + f"<h2>Per family</h2>{charts}<h2>Checks</h2><table><tr><th>result</th><th>check</th><th>kind</th>"
        f"<th>n</th><th>a - b</th><th>reason</th></tr>{rows}</table></body></html>"
    )


# The machine-readable verdict beside the reports: `tandem rollout` and `tandem release` read this model.
VERDICT_FILE = "verdict.json"


def write_reports(verdict: GateVerdict, directory: str | Path) -> tuple[Path, Path]:
    """Write ``gate-report.md`` and ``gate-report.html`` (for people) and ``verdict.json`` (the
    :class:`GateVerdict` itself, for rollout and release) into ``directory``; returns the two reports."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    markdown, page = directory / "gate-report.md", directory / "gate-report.html"
    (directory / VERDICT_FILE).write_text(verdict.model_dump_json(indent=2))
    markdown.write_text(render_markdown(verdict))
    page.write_text(render_html(verdict))
    return markdown, page
