"""`tandem bench fast`: a thin shell over :func:`bench.fast.run_fast_bench`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markdown import Markdown

console = Console()


def fast_bench_command(
    teacher: Annotated[
        str, typer.Option(help="Registry ref of the target model.")
    ] = "smollm2-135m-instruct@base",
    draft: Annotated[
        str | None, typer.Option(help="EAGLE-3 head ref or directory; default the teacher's best head.")
    ] = None,
    k: Annotated[
        int | None, typer.Option(help="num_speculative_tokens; default the head's chosen k.")
    ] = None,
    k_sweep: Annotated[
        str,
        typer.Option(
            help="k values timed at one stream in the turn group; the fastest is the reported k and the k of "
            "the multi-stream runs (ignored with --k; empty: the head's recorded k)."
        ),
    ] = "2,3,4",
    compare: Annotated[
        list[str] | None,
        typer.Option(
            help="A further EAGLE-3 head (ref or directory) timed at one stream in the turn group beside "
            "--draft, at every k (repeatable): a paired comparison of training rounds."
        ),
    ] = None,
    streams: Annotated[str, typer.Option(help="Comma-separated concurrency levels.")] = "1,4,16",
    max_tokens: Annotated[int, typer.Option(min=8, help="Tokens generated per request.")] = 128,
    single_requests: Annotated[
        int,
        typer.Option(
            min=2,
            help="One-stream requests per engine. Every one-stream engine is loaded at once and they take "
            "turns request by request, so host drift cancels from the ratios.",
        ),
    ] = 12,
    turn_group_size: Annotated[
        int,
        typer.Option(
            min=2,
            help="One-stream engines loaded at once (a standard engine included) taking turns; more make "
            "more groups, each with its own standard engine. ~3.5 GB per float32 engine of the bundled model.",
        ),
    ] = 4,
    turn_pause: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds before each turn, after the engine's stopped processes resume (the others stay "
            "stopped, so nothing spins beside it).",
        ),
    ] = 0.1,
    oracle_ks: Annotated[
        str, typer.Option(help="k values of the oracle ceiling (comma-separated; empty skips it).")
    ] = "3,5",
    variants: Annotated[
        str, typer.Option(help="Engine tuning variants for the standard tier (bench.fast.VARIANTS).")
    ] = "iomp,iomp-allcores,iomp-allcores-compiled",
    shared_host: Annotated[
        str,
        typer.Option(
            help="Variants also timed as two standard engines decoding at once on this host, one stream each "
            "(the two tiers share its cores); empty skips it."
        ),
    ] = "iomp,iomp-allcores",
    untrained: Annotated[
        bool, typer.Option(help="Time an untrained head of the same shape (true c).")
    ] = True,
    ngram: Annotated[bool, typer.Option(help="Time vLLM n-gram prompt lookup too.")] = True,
    registry: Annotated[str | None, typer.Option(help="Registry URL.")] = None,
    results_dir: Annotated[Path | None, typer.Option(help="Where the JSON result goes.")] = None,
) -> None:
    """Fast tier (EAGLE-3) vs the best-tuned standard tier with vLLM: tok/s and TPOT at 1/4/16 streams,
    acceptance per position, the oracle ceiling, the untrained head's cost and greedy identity."""
    from bench.fast import RESULTS_DIR, FastBenchConfig, run_fast_bench

    def ints(text: str) -> list[int]:
        return [int(part) for part in text.split(",") if part.strip()]

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = FastBenchConfig(
        teacher=teacher,
        draft=draft,
        num_speculative_tokens=k,
        k_sweep=ints(k_sweep),
        compare=compare or [],
        streams=ints(streams),
        max_tokens=max_tokens,
        single_requests=single_requests,
        turn_group_size=turn_group_size,
        turn_pause_s=turn_pause,
        oracle_ks=ints(oracle_ks),
        variants=[v.strip() for v in variants.split(",") if v.strip()],
        shared_host=[v.strip() for v in shared_host.split(",") if v.strip()],
        untrained=untrained,
        ngram=ngram,
        registry_url=registry,
        results_dir=results_dir or RESULTS_DIR,
    )
    with console.status("measuring engines...") as status:
        summary = run_fast_bench(config, progress=lambda message: status.update(message))
    from bench.fast_report import markdown_table

    console.print(Markdown(markdown_table(summary)))
    for key in (
        "speedup_interval_90",
        "oracle_ceiling_speedup",
        "fraction_of_ceiling",
        "cost_ratio_c",
        "crossover_streams",
        "standard_tpot_over_bound",
    ):
        if key in summary:
            console.print(f"{key}: [bold]{summary[key]}[/]")
    console.print(f"lossless (fp32 greedy identity): {json.dumps(summary['lossless'])}")
    console.print(f"written: {summary['results_file']}")
