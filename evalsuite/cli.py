"""Typer commands ``tandem eval`` and ``tandem gate`` (registered by ``cli/main.py``); light to import."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

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
) -> None:
    """Run the eval suite against a model and write Inspect logs; exit 1 if any task did not complete."""
    from evalsuite.runner import run_eval

    chosen = [f.strip() for f in families.split(",") if f.strip()] if families else None
    paths = run_eval(model, chosen, split, limit, base_url,
                     log_dir, seed, difficulty, rotation_key, max_samples, max_tokens=max_tokens,
                     max_tasks=max_tasks)  # fmt: skip
    from inspect_ai.log import read_eval_log

    failed = 0
    for path in paths:
        status = read_eval_log(str(path), header_only=True).status
        failed += status != "success"
        console.print(f"{'[green]' if status == 'success' else '[red]'}{status}[/] log: {path}")
    if failed:
        raise typer.Exit(code=1)


def gate_command(
    candidate: Path = typer.Option(..., "--candidate", help="Candidate Inspect log file or directory."),
    baseline: Path = typer.Option(..., "--baseline", help="Baseline Inspect log file or directory."),
    policy: Path = typer.Option(Path("infra/gate.yaml"), "--policy", help="Gate policy YAML."),
    report_dir: Path = typer.Option(Path("reports/gate"), "--report-dir", help="Where the reports go."),
) -> None:
    """Paired release gate: exit 0 pass, 1 fail, 2 error (TandemError)."""
    from evalsuite.gate_report import VERDICT_FILE
    from evalsuite.runner import run_gate

    verdict, markdown, page = run_gate(candidate, baseline, policy, report_dir)
    for check in verdict.checks:
        mark = "[green]PASS[/]" if check.passed else "[red]FAIL[/]"
        console.print(f"{mark} {check.name}: {check.reason}")
    console.print(f"report: {markdown} and {page}; verdict: {markdown.parent / VERDICT_FILE}")
    if not verdict.passed:
        raise typer.Exit(code=1)
