"""Typer commands ``tandem eval`` and ``tandem gate`` (registered by ``cli/main.py``); light to import."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

console = Console()


def eval_command(
    model: str = typer.Option(..., "--model", help="Bare gateway id (tandem-fast) or Inspect model name."),
    families: str | None = typer.Option(
        None, "--families", help="Comma-separated families (default: every registered family)."
    ),
    split: str = typer.Option("test", "--split", help="train | dev | test"),
    limit: int = typer.Option(20, "--limit", min=1, help="Samples per family."),
    base_url: str | None = typer.Option(
        None, "--base-url", help="OpenAI-compatible URL (default: the gateway)."
    ),
    log_dir: Path = typer.Option(Path("logs/eval"), "--log-dir", help="Where Inspect logs are written."),
    seed: int = typer.Option(0, "--seed"),
    difficulty: str | None = typer.Option(None, "--difficulty", help="easy | medium | hard (default: all)"),
    rotation_key: str = typer.Option("r0", "--rotation-key", help="Changes the test split's instances."),
    max_samples: int = typer.Option(4, "--max-samples", min=1, help="Samples run concurrently per family."),
    max_tokens: int = typer.Option(512, "--max-tokens", min=1, help="Output tokens per model turn."),
    max_tasks: int | None = typer.Option(
        None, "--max-tasks", min=1, help="Families run at once (default: all of them)."
    ),
    traffic_set: str | None = typer.Option(
        None,
        "--traffic-set",
        help="Eval set the 'traffic' family replays (traffic-NAME@PERIOD, from `tandem traffic build-set`).",
    ),
    family_option: list[str] | None = typer.Option(
        None,
        "--family-option",
        "-O",
        help="Option of a family's task, FAMILY.OPTION=VALUE (repeatable), e.g. traffic.registry=s3://bucket/r "
        "or long_context.max_length=16384 (default: the window the gateway serves the model with).",
    ),
) -> None:
    """Run the eval suite against a model and write Inspect logs; exit 1 if any task did not complete."""
    from evalsuite.runner import run_eval

    chosen = [f.strip() for f in families.split(",") if f.strip()] if families else None
    options = _family_options(family_option or [])
    if traffic_set:
        options.setdefault("traffic", {})["set"] = traffic_set
    paths = run_eval(model, chosen, split, limit, base_url,
                     log_dir, seed, difficulty, rotation_key, max_samples, max_tokens=max_tokens,
                     max_tasks=max_tasks, family_options=options)  # fmt: skip
    from inspect_ai.log import read_eval_log

    failed = 0
    for path in paths:
        status = read_eval_log(str(path), header_only=True).status
        failed += status != "success"
        console.print(f"{'[green]' if status == 'success' else '[red]'}{status}[/] log: {path}")
    if failed:
        raise typer.Exit(code=1)


def _family_options(pairs: list[str]) -> dict[str, dict[str, str]]:
    """``FAMILY.OPTION=VALUE`` strings as ``{family: {option: value}}``; EvalError for a malformed one."""
    from evalsuite.errors import EvalError

    options: dict[str, dict[str, str]] = {}
    for pair in pairs:
        target, equals, value = pair.partition("=")
        family, dot, option = target.partition(".")
        if not (equals and dot and family and option):
            raise EvalError(
                f"--family-option {pair!r}: expected FAMILY.OPTION=VALUE, e.g. traffic.set=traffic-x@2026-01"
            )
        options.setdefault(family.strip(), {})[option.strip()] = value
    return options


def gate_command(
    candidate: Path = typer.Option(..., "--candidate", help="Candidate Inspect log file or directory."),
    baseline: Path = typer.Option(..., "--baseline", help="Baseline Inspect log file or directory."),
    policy: Path = typer.Option(Path("infra/gate.yaml"), "--policy", help="Gate policy YAML."),
    report_dir: Path = typer.Option(Path("reports/gate"), "--report-dir", help="Where the reports go."),
    human_preference: Path | None = typer.Option(
        None,
        "--human-preference",
        help="Blind-review summary JSON (`tandem review export --out`): adds the human-preference row.",
    ),
) -> None:
    """Paired release gate: exit 0 pass, 1 fail, 2 error (TandemError)."""
    from evalsuite.gate_report import VERDICT_FILE
    from evalsuite.runner import run_gate

    verdict, markdown, page = run_gate(candidate, baseline, policy, report_dir, human_preference)
    for check in verdict.checks:
        mark = "[green]PASS[/]" if check.passed else "[red]FAIL[/]"
        # Check names hold brackets ("documents [a vs b]"): text, not rich markup.
        console.print(f"{mark} {escape(check.name)}: {escape(check.reason)}")
    console.print(f"report: {markdown} and {page}; verdict: {markdown.parent / VERDICT_FILE}")
    if not verdict.passed:
        raise typer.Exit(code=1)
