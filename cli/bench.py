"""`tandem bench ...`: benchmarks that measure real runs and write JSON under bench/results/."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bench import RESULTS_DIR

console = Console()
bench_app = typer.Typer(
    help="Benchmarks: each measures a real run and writes JSON under bench/results/.", no_args_is_help=True
)


def _register_package_benches() -> None:
    from cli.bench_context import context_bench_command
    from cli.bench_fast import fast_bench_command
    from cli.bench_posttrain import posttrain_bench_command

    bench_app.command("context")(context_bench_command)
    bench_app.command("fast")(fast_bench_command)
    bench_app.command("posttrain")(posttrain_bench_command)


_register_package_benches()


@bench_app.command("tiers")
def bench_tiers(
    url: Annotated[
        str | None, typer.Option(help="Benchmark an already running gateway (default: start one).")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="Gateway config when starting one.")] = None,
    streams: Annotated[str, typer.Option(help="Comma-separated concurrency levels.")] = "1,16",
    max_tokens: Annotated[int, typer.Option(min=8, help="Tokens decoded per request (EOS ignored).")] = 128,
    requests_per_stream: Annotated[int, typer.Option(min=1, help="Requests per concurrent stream.")] = 2,
    out: Annotated[Path, typer.Option(help="Results directory.")] = RESULTS_DIR,
) -> None:
    """TTFT, time per output token and tokens/s for each tier at 1 and 16 streams, with fast/standard ratios."""
    from bench.recording import write_result
    from bench.tiers import markdown_table, run_tier_bench

    levels = tuple(int(part) for part in streams.split(",") if part.strip())
    started_here = False
    if url is None:
        from gateway.config import load_config
        from gateway.server import start_gateway

        with console.status("starting the gateway...") as status:
            running = start_gateway(load_config(config), on_progress=lambda m: status.update(m))
        url, started_here = running.base_url, True
    try:
        with console.status(f"measuring tiers at {levels} streams x {max_tokens} tokens..."):
            result = run_tier_bench(
                url.rstrip("/"),
                models={"standard": "tandem-standard", "fast": "tandem-fast"},
                stream_levels=levels,
                max_tokens=max_tokens,
                requests_per_stream=requests_per_stream,
            )
    finally:
        if started_here:
            from gateway.server import stop_gateway

            stop_gateway()
    path = write_result(result, out, "tiers")
    table = Table(title="tiers benchmark")
    for column in ("tier", "streams", "TTFT p50 ms", "TTFT p95 ms", "TPOT p50 ms", "tok/s", "errors"):
        table.add_column(column)
    for level in result["levels"]:
        table.add_row(
            level["tier"],
            str(level["streams"]),
            str(level["ttft_p50_ms"]),
            str(level["ttft_p95_ms"]),
            str(level["tpot_p50_ms"]),
            str(level["tokens_per_s"]),
            str(level["errors"]),
        )
    console.print(table)
    for name, value in result["ratios"].items():
        console.print(f"{name}: [bold]{value}x[/]")
    console.print(f"written: {path}")
    (out / "tiers-latest.md").write_text(markdown_table(result))


@bench_app.command("eval")
def bench_eval(
    concurrency: Annotated[int, typer.Option(min=1, help="Concurrent sandboxes / samples.")] = 4,
    sandboxes: Annotated[int, typer.Option(min=1, help="Sandboxes started for the latency figures.")] = 32,
    samples: Annotated[int, typer.Option(min=1, help="Samples per family for the throughput run.")] = 8,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="Results directory.")] = RESULTS_DIR,
    model: Annotated[str, typer.Option(help="Model for the throughput run.")] = "mockllm/model",
) -> None:
    """Sandbox start+exec+cleanup latency (p50/p95) and suite throughput, as JSON under bench/results/."""
    from bench.eval import run_eval_bench

    result = run_eval_bench(concurrency, sandboxes, samples, output_dir, model)
    console.print_json(data=result)


@bench_app.command("gateway")
def bench_gateway(
    requests: Annotated[int, typer.Option(min=64, help="Requests per round and ingress.")] = 1000,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight.")] = 64,
    rounds: Annotated[int, typer.Option(min=1, help="Alternating rounds per ingress.")] = 2,
    serial: Annotated[
        int, typer.Option(min=10, help="One-at-a-time requests per ingress, interleaved (no queueing).")
    ] = 200,
    port: Annotated[int, typer.Option(help="Port for the benchmark's own Serve proxy.")] = 8123,
    out: Annotated[Path, typer.Option(help="Results directory.")] = RESULTS_DIR,
) -> None:
    """The gateway's added latency (p50/p99) and RPS over the bare OpenAiIngress, one cheap engine."""
    from bench.gateway_overhead import run_gateway_overhead_bench
    from bench.recording import write_result

    with console.status(f"measuring {rounds} rounds x {requests} requests at {concurrency} concurrency..."):
        result = run_gateway_overhead_bench(
            requests=requests, concurrency=concurrency, rounds=rounds, serial_requests=serial, port=port
        )
    table = Table(title="gateway overhead: Tandem ingress vs bare OpenAiIngress, same engine")
    for column in ("ingress", "load", "p50 ms", "p99 ms", "RPS"):
        table.add_column(column)
    for name in ("bare", "gateway"):
        row = result[name]
        table.add_row(
            name, f"{concurrency} concurrent", str(row["p50_ms"]), str(row["p99_ms"]), str(row["rps"])
        )
    for name in ("bare", "gateway"):
        row = result["serial"][name]
        table.add_row(name, "serial", str(row["p50_ms"]), str(row["p99_ms"]), "")
    for kind, row in result["pipeline_in_process"].items():
        table.add_row(f"pipeline only ({kind})", "in process", str(row["p50_ms"]), str(row["p99_ms"]), "")
    console.print(table)
    console.print(
        f"added at {concurrency} concurrent: p50 [bold]{result['added_p50_ms']} ms[/], "
        f"p99 [bold]{result['added_p99_ms']} ms[/], RPS ratio {result['rps_ratio']}; serial: p50 "
        f"[bold]{result['serial_added_p50_ms']} ms[/], p99 [bold]{result['serial_added_p99_ms']} ms[/]"
    )
    console.print(f"written: {write_result(result, out, 'gateway')}")


@bench_app.command("load")
def bench_load(
    url: Annotated[str, typer.Option(help="A running gateway, e.g. http://127.0.0.1:8000.")],
    api_key: Annotated[str, typer.Option(envvar="TANDEM_API_KEY", help="Key with room for the whole run.")],
    limited_key: Annotated[
        str | None, typer.Option(help="A key with a small limit, used for every 10th request (expects 429s).")
    ] = None,
    requests: Annotated[int, typer.Option(min=1, max=20_000)] = 2000,
    concurrency: Annotated[int, typer.Option(min=1, max=512)] = 64,
    max_tokens: Annotated[int, typer.Option(min=1, max=256)] = 8,
    kill_fast: Annotated[
        bool, typer.Option(help="Kill the fast tier's replica a third of the way in.")
    ] = False,
    ray_address: Annotated[
        str,
        typer.Option(
            help="The gateway's Ray cluster (GCS host:port) for --kill-fast; 'auto': the newest local one."
        ),
    ] = "auto",
    out: Annotated[Path, typer.Option(help="Results directory.")] = RESULTS_DIR,
) -> None:
    """Bounded loopback load test: status codes, 5xx count, 429 shape; optionally with a replica killed."""
    from bench.load import run_load_test
    from bench.recording import write_result

    with console.status(f"{requests} requests at {concurrency} concurrency..."):
        result = run_load_test(
            url,
            api_key,
            limited_key=limited_key,
            requests=requests,
            concurrency=concurrency,
            max_tokens=max_tokens,
            kill_fast=kill_fast,
            ray_address=ray_address,
        )
    console.print_json(data={k: v for k, v in result.items() if not k.endswith("_samples")})
    for sample in result["server_error_samples"] + result["malformed_429_samples"]:
        console.print(f"[red]{sample}[/]")
    auth_failures = result["statuses"].get("401", 0) + result["statuses"].get("403", 0)
    if auth_failures == result["requests"]:
        # Nothing reached a model: a wrong key measures the auth path, not the load; keep no result.
        console.print(f"[red]every request was refused ({auth_failures} x 401/403): check --api-key[/]")
        raise typer.Exit(1)
    console.print(f"written: {write_result(result, out, 'load-kill' if kill_fast else 'load')}")
