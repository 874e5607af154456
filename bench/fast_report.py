"""The arithmetic and the README table of ``tandem bench fast``, from the engines' recorded runs.

``runs`` maps a run's name to what :mod:`bench.fast_engine` returned:

- ``standard[<variant>]``: the standard tier alone, per tuning variant, at every stream count;
- ``fast``: the fast tier alone at the stream counts above one;
- ``shared[<variant>]``: two standard engines decoding at once, ``{"engines": [run, run]}``;
- ``turns``: the one-stream engines in groups, ``{"groups": [{label: run}, ...]}``. A group's engines are
  loaded at once and take turns request by request; every group holds a ``standard`` engine beside
  ``k<n>`` (the head at k=n), ``compare <ref> k<n>`` (a compared head), ``oracle k<n>``, ``untrained`` or
  ``ngram`` engines.

One-stream ratios come from ``turns`` only, each engine against the standard engine of its own group:
those were timed over the same stretch of the host, so the drift between engines run minutes apart (up
to 14% here) does not enter them.
"""

from __future__ import annotations

import random
from pathlib import Path
from statistics import median
from typing import Any

from bench import recording

#: Resamples of the bootstrap interval of a one-stream ratio (seeded: a rerun of the report agrees).
BOOTSTRAP_RESAMPLES = 2000


def compare_tokens(reference: list[list[int]], candidate: list[list[int]]) -> dict[str, Any]:
    identical = sum(a == b for a, b in zip(reference, candidate, strict=True))
    return {"identical": identical, "total": len(reference), "lossless": identical == len(reference)}


def phase_summary(phase: dict[str, Any]) -> dict[str, Any]:
    requests = phase["requests"]
    summary = {
        "streams": phase["streams"],
        "tokens_per_s": round(phase["tokens_per_s"], 2),
        "tpot_p50_ms": round(1000 * median(r["tpot_s"] for r in requests), 2),
        "ttft_p50_ms": round(1000 * median(r["ttft_s"] for r in requests), 2),
        "generated_tokens": phase["generated_tokens"],
    }
    spec = phase.get("spec_decode")
    if spec:
        summary["acceptance_rate"] = round(spec["acceptance_rate"], 4) if spec["acceptance_rate"] else None
        summary["mean_acceptance_length"] = (
            round(spec["mean_acceptance_length"], 4) if spec["mean_acceptance_length"] else None
        )
        summary["accepted_per_position"] = spec["accepted_per_position"]
    return summary


def paired_interval(
    baseline: list[dict[str, Any]], candidate: list[dict[str, Any]], *, level: float = 0.9
) -> list[float]:
    """Bootstrap interval of tokens/s(candidate) / tokens/s(baseline) over prompts, resampled in pairs.

    Request i of both engines answered the same prompt in neighbouring turns, so a pair shares the prompt
    and the moment; resampling pairs keeps that.
    """
    rng = random.Random(0)
    pairs = [
        (len(b["token_ids"]), b["seconds"], len(c["token_ids"]), c["seconds"])
        for b, c in zip(baseline, candidate, strict=True)
    ]
    ratios = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        drawn = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        base_rate = sum(p[0] for p in drawn) / sum(p[1] for p in drawn)
        ratios.append(sum(p[2] for p in drawn) / sum(p[3] for p in drawn) / base_rate)
    ratios.sort()
    tail = (1 - level) / 2
    return [round(ratios[int(tail * len(ratios))], 3), round(ratios[int((1 - tail) * len(ratios)) - 1], 3)]


def _in_turns(groups: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Every engine of every turn group against the standard engine of its group (``group``: its index)."""
    summary: dict[str, dict[str, Any]] = {}
    for index, engines in enumerate(groups):
        standard = engines["standard"]["phases"]["1"]
        reference = [r["token_ids"] for r in standard["requests"]]
        summary.setdefault("standard", {**phase_summary(standard), "speedup": 1.0, "group": index})
        for label, run in engines.items():
            if label == "standard":
                continue
            phase = run["phases"]["1"]
            summary[label] = {
                **phase_summary(phase),
                "group": index,
                "speedup": round(phase["tokens_per_s"] / standard["tokens_per_s"], 3),
                "speedup_interval_90": paired_interval(standard["requests"], phase["requests"]),
                "lossless": compare_tokens(reference, [r["token_ids"] for r in phase["requests"]]),
            }
    return summary


def fastest_k(turns: dict[str, Any]) -> int:
    """The k whose head engine ran fastest against the standard engine of its turn group."""
    entries = _in_turns(turns["groups"])
    best = max(
        (label for label in entries if label.startswith("k")), key=lambda label: entries[label]["speedup"]
    )
    return int(best.removeprefix("k"))


def summarise(runs: dict[str, dict[str, Any]], best_variant: str, k: int, untrained_k: int) -> dict[str, Any]:
    """Speedups, acceptance, ceiling, c and greedy identity from ``runs`` (module docstring)."""
    standard = runs[f"standard[{best_variant}]"]["phases"]
    fast = dict(runs["fast"]["phases"]) if "fast" in runs else {}
    summary: dict[str, Any] = {
        "variants": {
            name.removeprefix("standard[").removesuffix("]"): {
                p: phase_summary(v) for p, v in run["phases"].items()
            }
            for name, run in runs.items()
            if name.startswith("standard[")
        },
        "engine_start_s": {
            name: round(run["engine_start_s"], 1) for name, run in runs.items() if "engine_start_s" in run
        },
    }
    speedup: dict[str, float] = {}
    if "turns" in runs:
        groups = runs["turns"]["groups"]
        turns = _in_turns(groups)
        summary["in_turns"] = turns
        # How far the host drifted between groups: each group's standard engine.
        summary["in_turns_standard_tokens_per_s"] = [
            round(group["standard"]["phases"]["1"]["tokens_per_s"], 2) for group in groups
        ]
        own = groups[turns[f"k{k}"]["group"]]
        standard = {**standard, "1": own["standard"]["phases"]["1"]}
        fast["1"] = own[f"k{k}"]["phases"]["1"]
        speedup["1"] = turns[f"k{k}"]["speedup"]
        summary["speedup_interval_90"] = turns[f"k{k}"]["speedup_interval_90"]
        summary["k_sweep"] = {
            label.removeprefix("k"): entry for label, entry in turns.items() if label.startswith("k")
        }
        summary["compare"] = {
            label.removeprefix("compare "): entry
            for label, entry in turns.items()
            if label.startswith("compare ")
        }
        summary["oracle"] = {
            label.removeprefix("oracle k"): entry
            for label, entry in turns.items()
            if label.startswith("oracle")
        }
        for name in ("untrained", "ngram"):
            if name in turns:
                summary[name] = turns[name]
        if "untrained" in turns:
            entry = turns["untrained"]
            # Single-stream step model: ratio = E[tokens per step] / (1 + k c)  =>  c (verification included).
            summary["cost_ratio_c"] = round(
                ((entry.get("mean_acceptance_length") or 1.0) / entry["speedup"] - 1) / untrained_k, 4
            )
        if summary["oracle"]:
            ceiling = max(v["speedup"] for v in summary["oracle"].values())
            summary["oracle_ceiling_speedup"] = ceiling
            summary["fraction_of_ceiling"] = round(speedup["1"] / ceiling, 3)
    speedup.update(
        {p: round(fast[p]["tokens_per_s"] / standard[p]["tokens_per_s"], 3) for p in fast if p != "1"}
    )
    summary["standard"] = {p: phase_summary(v) for p, v in standard.items()}
    summary["fast"] = {p: phase_summary(v) for p, v in fast.items()}
    summary["speedup"] = dict(sorted(speedup.items(), key=lambda item: int(item[0])))
    slower = [int(p) for p, ratio in speedup.items() if ratio < 1.0]
    summary["crossover_streams"] = min(slower) if slower else None
    summary["lossless"] = {
        p: compare_tokens(
            [r["token_ids"] for r in standard[p]["requests"]], [r["token_ids"] for r in fast[p]["requests"]]
        )
        for p in fast
    }
    shared = {
        name.removeprefix("shared[").removesuffix("]"): [e["phases"]["1"] for e in run["engines"]]
        for name, run in runs.items()
        if name.startswith("shared[")
    }
    if shared:
        summary["shared_host"] = {
            variant: {
                "tokens_per_s": [round(p["tokens_per_s"], 2) for p in pair],
                "total_tokens_per_s": round(sum(p["tokens_per_s"] for p in pair), 2),
                "tpot_p50_ms": [phase_summary(p)["tpot_p50_ms"] for p in pair],
                "alone_tokens_per_s": summary["variants"].get(variant, {}).get("1", {}).get("tokens_per_s"),
            }
            for variant, pair in shared.items()
        }
    return summary


def _row(label: str, streams: int | str, phase: dict[str, Any], ratio: str = "") -> str:
    return (
        f"| {label} | {streams} | {phase['tokens_per_s']} | {phase['tpot_p50_ms']} | {ratio} | "
        f"{phase.get('acceptance_rate', '')} | {phase.get('accepted_per_position', '')} |"
    )


def markdown_table(summary: dict[str, Any]) -> str:
    """The README table: one stream from the turn group (with its 90% interval), more streams alone."""
    k = summary["num_speculative_tokens"]
    rows = [
        "| engine | streams | tok/s | TPOT p50 ms | fast/standard | acceptance rate | accepted per position |",
        "|---|---|---|---|---|---|---|",
    ]
    for streams, phase in summary["standard"].items():
        fast = summary["fast"][streams]
        ratio = f"**{summary['speedup'][streams]}**"
        if streams == "1" and "speedup_interval_90" in summary:
            low, high = summary["speedup_interval_90"]
            ratio += f" (90%: {low}-{high})"
        how = ", in turns" if streams == "1" and "in_turns" in summary else ""
        rows.append(_row(f"standard ({summary['tuning_variant']}){how}", streams, phase, "1.0"))
        rows.append(_row(f"fast (eagle3, k={k}){how}", streams, fast, ratio))
    for variant, by_streams in summary.get("variants", {}).items():
        if "1" in by_streams and (variant != summary["tuning_variant"] or "in_turns" in summary):
            rows.append(_row(f"standard, tuning variant {variant}, alone", 1, by_streams["1"]))
    for variant, pair in summary.get("shared_host", {}).items():
        rows.append(
            f"| two standard engines at once ({variant}), each | 1 + 1 | {' + '.join(map(str, pair['tokens_per_s']))} "
            f"= {pair['total_tokens_per_s']} | {' / '.join(map(str, pair['tpot_p50_ms']))} | | | |"
        )
    labelled = [
        *((f"in turns: eagle3 k={n}", entry) for n, entry in summary.get("k_sweep", {}).items()),
        *((f"in turns: compared head {label}", entry) for label, entry in summary.get("compare", {}).items()),
        *((f"in turns: oracle ceiling k={n}", entry) for n, entry in summary.get("oracle", {}).items()),
        *((f"in turns: {name}", summary[name]) for name in ("untrained", "ngram") if name in summary),
    ]
    for label, entry in labelled:
        low, high = entry["speedup_interval_90"]
        rows.append(_row(label, 1, entry, f"{entry['speedup']} ({low}-{high})"))
    if "in_turns_standard_tokens_per_s" in summary:
        rows.append(
            "\nOne-stream ratios are against the standard engine of the same turn group; those ran at "
            f"{', '.join(map(str, summary['in_turns_standard_tokens_per_s']))} tok/s in groups 1, 2, ..."
        )
    if "standard_tpot_over_bound" in summary:
        rows.append(
            f"\nStandard tier TPOT / bandwidth bound: **{summary['standard_tpot_over_bound']}** (bound "
            f"{summary['bandwidth_bound_tpot_ms']} ms per token at {summary['memory_bandwidth_gbps']} GB/s)."
        )
    return "\n".join(rows) + "\n"


def _bar_label(label: str) -> str:
    """A short bar name: 'k3' -> 'eagle3 k=3', 'compare name@r7 k3' -> 'compare @r7 k=3' (the full refs
    are in the table; long ones pushed the plot's title off the figure)."""
    if label.startswith("k"):
        return label.replace("k", "eagle3 k=", 1)
    if label.startswith("compare "):
        ref, k = label.removeprefix("compare ").rsplit(" ", 1)
        return f"compare @{ref.rsplit('@', 1)[-1]} {k.replace('k', 'k=', 1)}"
    return label


def plot_one_stream(summary: dict[str, Any], path: Path) -> Path:
    """One bar per one-stream engine: its speedup over the standard engine of its turn group, with the 90%
    interval; the reported k's bar is dark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = [(label, entry) for label, entry in summary["in_turns"].items() if label != "standard"]
    chosen = f"k{summary['num_speculative_tokens']}"
    figure, axis = plt.subplots(figsize=(8, 0.45 * len(entries) + 1.4))
    for row, (label, entry) in enumerate(entries):
        low, high = entry["speedup_interval_90"]
        axis.barh(row, entry["speedup"], color="#1f4e79" if label == chosen else "#9dc3e6")
        axis.errorbar(
            entry["speedup"],
            row,
            xerr=[[entry["speedup"] - low], [high - entry["speedup"]]],
            color="black",
            capsize=3,
        )
        axis.text(high + 0.05, row, f"{entry['speedup']:.2f}x", va="center", fontsize=8)
    axis.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    axis.set_xlim(0, 1.15 * max(entry["speedup_interval_90"][1] for _, entry in entries))
    axis.set_yticks(range(len(entries)), [_bar_label(label) for label, _ in entries])
    axis.invert_yaxis()
    axis.set(
        xlabel="speedup over the standard engine of its turn group (90% interval)",
        title=f"fast tier at one stream: {summary.get('draft', '')}",
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_result(summary: dict[str, Any], results_dir: Path) -> Path:
    """``fast-<time>.json``, ``fast-latest.json``, ``.md`` (the table) and ``.png`` (the one-stream plot)."""
    path = recording.write_result(summary, results_dir, "fast", markdown_table(summary))
    if "in_turns" in summary:
        plot_one_stream(summary, results_dir / "fast-latest.png")
    summary["results_file"] = str(path)
    return path
