"""`tandem bench posttrain`: a thin shell over :func:`bench.posttrain_ray.run_posttrain_bench`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markdown import Markdown

console = Console()


def posttrain_bench_command(
    model: Annotated[
        str, typer.Option(help="Registry ref or directory of the policy.")
    ] = "smollm2-135m-instruct@base",
    family: Annotated[str, typer.Option(help="Task family whose prompts are sampled.")] = "documents",
    prompts: Annotated[int, typer.Option(min=1, help="Prompts of the rollout phase.")] = 8,
    num_generations: Annotated[int, typer.Option(min=2, help="Samples per prompt.")] = 4,
    max_tokens: Annotated[int, typer.Option(min=8, help="Tokens per sample (EOS ignored).")] = 64,
    learner_steps: Annotated[int, typer.Option(min=2, help="Learner steps per rank count.")] = 3,
    grpo_steps: Annotated[int, typer.Option(min=3, help="GRPO steps per sync / async run.")] = 4,
    grpo_batch: Annotated[int, typer.Option(min=1, help="Prompts per GRPO step.")] = 2,
    registry: Annotated[str | None, typer.Option(help="Registry URL.")] = None,
    results_dir: Annotated[Path | None, typer.Option(help="Where the JSON result goes.")] = None,
) -> None:
    """Post-training on Ray, on the bundled model: rollout tok/s of a vLLM engine vs HF generate on the same
    prompts, learner step time with 1 vs 2 DDP ranks, and GRPO wall time per step synchronous vs one step
    off-policy with the learner's idle fraction. Takes ~15 minutes on 2 cores."""
    from bench.posttrain_ray import RESULTS_DIR, PosttrainBenchConfig, markdown_table, run_posttrain_bench

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = PosttrainBenchConfig(
        model=model,
        family=family,
        prompts=prompts,
        num_generations=num_generations,
        max_tokens=max_tokens,
        learner_steps=learner_steps,
        grpo_steps=grpo_steps,
        grpo_batch=grpo_batch,
        registry_url=registry,
        results_dir=results_dir or RESULTS_DIR,
    )
    with console.status("measuring...") as status:
        summary = run_posttrain_bench(config, progress=lambda message: status.update(message))
    console.print(Markdown(markdown_table(summary)))
    console.print(f"written: {summary['results_file']}")
