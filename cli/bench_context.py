"""`tandem bench context`: a thin shell over :func:`bench.context.run_context_bench`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markdown import Markdown

console = Console()


def context_bench_command(
    chunks: Annotated[
        str,
        typer.Option(
            help="max_num_batched_tokens values measured with chunked prefill on (comma-separated)."
        ),
    ] = "256,512,1024,2048",
    chunked_off: Annotated[
        bool, typer.Option(help="Also measure chunked prefill off (whole prompt in one step).")
    ] = True,
    vllm_default: Annotated[
        bool, typer.Option(help="Also measure vLLM's defaults (nothing set: what `tandem serve` gets).")
    ] = True,
    streams: Annotated[int, typer.Option(min=1, help="Short streams decoding concurrently.")] = 8,
    max_tokens: Annotated[int, typer.Option(min=8, help="Tokens each short stream decodes unloaded.")] = 64,
    long_tokens: Annotated[int, typer.Option(min=16, help="Tokens of the long prompt.")] = 8000,
    repeats: Annotated[int, typer.Option(min=1, help="Unloaded + loaded phases per variant.")] = 1,
    target_ratio: Annotated[float, typer.Option(help="Loaded p99 TPOT / unloaded p99 TPOT to meet.")] = 2.0,
    model: Annotated[
        Path | None, typer.Option(help="Model directory; default the bundled SmolLM2-135M-Instruct.")
    ] = None,
    results_dir: Annotated[Path | None, typer.Option(help="Where the JSON result goes.")] = None,
) -> None:
    """Chunked prefill, measured: p99 time per output token of short concurrent streams while one long
    prompt prefills, with chunked prefill off, on at each chunk size and at vLLM's defaults, against the
    same streams unloaded. One vLLM engine per variant, with `tandem serve`'s engine settings; about 2-3
    minutes per variant on 2 cores at the defaults. Writes bench/results/context-*.json and a Markdown table."""
    from bench.context import RESULTS_DIR, ContextBenchConfig, markdown_table, run_context_bench

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = ContextBenchConfig(
        model=model,
        streams=streams,
        max_tokens=max_tokens,
        long_tokens=long_tokens,
        chunks=[int(part) for part in chunks.split(",") if part.strip()],
        chunked_off=chunked_off,
        vllm_default=vllm_default,
        repeats=repeats,
        target_ratio=target_ratio,
        results_dir=results_dir or RESULTS_DIR,
    )
    with console.status("measuring one engine per variant...") as status:
        summary = run_context_bench(config, progress=lambda message: status.update(message))
    console.print(Markdown(markdown_table(summary)))
    console.print(f"written: {summary['results_file']}")
