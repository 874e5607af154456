"""Run the suite against a model and apply the gate: the Python API behind ``tandem eval`` / ``tandem gate``."""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from typing import Any

from evalsuite.errors import EvalError
from evalsuite.gate import GateVerdict, evaluate_gate, load_policy, read_outcomes
from evalsuite.gate_report import write_reports
from evalsuite.generators import DEFAULT_ROTATION_KEY
from evalsuite.registry import family_names, get_family, get_replay_family, replay_family_names
from evalsuite.schema import DIFFICULTIES, SPLITS

log = logging.getLogger(__name__)

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8000/v1"
# Bare ids such as ``tandem-fast`` name a model behind the local gateway, reached as an OpenAI-compatible
# service; anything with a slash is an Inspect model name (``openai/gpt-4o``, ``mockllm/model``, ...).
GATEWAY_SERVICE = "tandem"


def resolve_model(model: str, base_url: str | None = None, **model_args: Any) -> Any:
    """An Inspect ``Model`` for ``model``; bare ids go to the gateway at ``base_url``."""
    from inspect_ai.model import get_model

    gateway_key = os.environ.get("TANDEM_API_KEY", "tandem-local")
    if "/" not in model:
        return get_model(f"openai-api/{GATEWAY_SERVICE}/{model}", base_url=base_url or DEFAULT_GATEWAY_URL,
                         api_key=gateway_key, **model_args)  # fmt: skip
    if model.startswith("openai/") and base_url and not os.environ.get("OPENAI_API_KEY"):
        # an OpenAI-compatible URL (such as the gateway) with no OpenAI key: use the gateway's key
        model_args.setdefault("api_key", gateway_key)
    return get_model(model, base_url=base_url, **model_args)


def build_tasks(
    families: list[str],
    split: str = "test",
    limit: int = 20,
    seed: int = 0,
    difficulty: str | None = None,
    rotation_key: str = DEFAULT_ROTATION_KEY,
    family_options: dict[str, dict[str, Any]] | None = None,
) -> list[Any]:
    """Inspect ``Task`` objects for ``families`` (``limit`` samples each), from the family registry.

    ``family_options`` gives a replay family (``traffic``) its options, e.g. ``{"traffic": {"set": REF}}``.
    """
    known = (*family_names(), *replay_family_names())
    unknown = [f for f in families if f not in known]
    if unknown:
        raise EvalError(f"unknown families {unknown} (allowed: {', '.join(sorted(known))})")
    family_options = family_options or {}
    stray = sorted(set(family_options) - set(families))
    if stray:
        raise EvalError(
            f"options given for {stray[0]!r}, which is not among the families run ({', '.join(families)})"
        )
    if split not in SPLITS:
        raise EvalError(f"unknown split {split!r} (allowed: {', '.join(SPLITS)})")
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise EvalError(f"unknown difficulty {difficulty!r} (allowed: {', '.join(DIFFICULTIES)})")
    tasks = []
    for f in families:
        if f in replay_family_names():
            replay = get_replay_family(f)
            options = family_options.get(f, {})
            replay.check_options(options)
            tasks.append(replay.load_task()(split=split, n=limit, seed=seed, **options))
            continue
        task = get_family(f).load_task()
        options = family_options.get(f, {})
        accepted = set(inspect.signature(task).parameters) - {
            "split", "n", "seed", "difficulty", "rotation_key"
        }  # fmt: skip
        refused = sorted(set(options) - accepted)
        if refused:
            takes = ", ".join(sorted(accepted)) or "none"
            raise EvalError(f"family {f!r} has no option {refused[0]!r} (options it takes: {takes})")
        tasks.append(
            task(split=split, n=limit, seed=seed, difficulty=difficulty, rotation_key=rotation_key, **options)
        )
    return tasks


def served_window(model: str, base_url: str | None) -> int | None:
    """The context window the gateway serves ``model`` (a bare id) with, from its ``/v1/models``
    (``max_request_context_length``); None when it cannot be read."""
    import httpx

    url = f"{(base_url or DEFAULT_GATEWAY_URL).rstrip('/')}/models"
    key = os.environ.get("TANDEM_API_KEY", "tandem-local")
    try:
        listed = httpx.get(url, headers={"authorization": f"Bearer {key}"}, timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        log.warning("event=served_window_unknown url=%s error=%s", url, exc)
        return None
    for entry in listed:
        if entry.get("id") == model:
            window = (entry.get("metadata") or {}).get("max_request_context_length")
            return int(window) if window else None
    return None


def run_eval(
    model: str | Any,
    families: list[str] | None = None,
    split: str = "test",
    limit: int = 20,
    base_url: str | None = None,
    log_dir: str | Path = "logs/eval",
    seed: int = 0,
    difficulty: str | None = None,
    rotation_key: str = DEFAULT_ROTATION_KEY,
    max_samples: int = 4,
    display: str = "none",
    max_tokens: int = 512,
    max_tasks: int | None = None,
    family_options: dict[str, dict[str, Any]] | None = None,
) -> list[Path]:
    """Evaluate ``model`` (name or Inspect ``Model``) on ``families`` (default: every registered generated
    family; a replay family such as ``traffic`` runs only when named, with ``family_options``); returns the
    Inspect log files written."""
    from inspect_ai import eval as inspect_eval

    family_options = dict(family_options or {})
    if isinstance(model, str) and "/" not in model and "long_context" in (families or family_names()):
        family_options["long_context"] = _long_context_window(model, base_url, family_options)
    tasks = build_tasks(list(families or family_names()), split, limit, seed, difficulty, rotation_key,
                        family_options)  # fmt: skip
    resolved = resolve_model(model, base_url) if isinstance(model, str) else model
    # Without a cap an OpenAI-compatible server may decode up to the whole context window per turn.
    # Families run side by side by default: a served model batches their requests, one at a time idles it.
    logs = inspect_eval(tasks, model=resolved, log_dir=str(log_dir), max_samples=max_samples,
                        max_tasks=max_tasks or len(tasks), fail_on_error=False, max_tokens=max_tokens,
                        display=display)  # type: ignore[arg-type]  # fmt: skip
    failed = [lg for lg in logs if lg.status != "success"]
    for eval_log in failed:
        log.warning("event=eval_incomplete task=%s status=%s error=%s", eval_log.eval.task, eval_log.status,
                    eval_log.error.message if eval_log.error else "")  # fmt: skip
    paths = [Path(lg.location) for lg in logs]
    write_family_reports(logs, log_dir)
    log.info("event=eval_done model=%s logs=%s", getattr(resolved, "name", resolved), [str(p) for p in paths])
    return paths


def _long_context_window(
    model: str, base_url: str | None, family_options: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The long_context options for a gateway model: haystacks up to the window the gateway serves it
    with (a RoPE-extended tier's is longer), unless the caller or the environment set ``max_length``."""
    from evalsuite.families.long_context.haystack import MAX_LENGTH_ENV

    options = dict(family_options.get("long_context", {}))
    if "max_length" in options or os.environ.get(MAX_LENGTH_ENV):
        return options
    window = served_window(model, base_url)
    if window is not None:
        log.info("event=long_context_window model=%s max_length=%d", model, window)
        options["max_length"] = window
    return options


def write_family_reports(logs: list[Any], out_dir: str | Path) -> list[Path]:
    """Call the report writer of every family that ran and has one (e.g. ``long_context-heatmap.png``) with
    that family's scored samples; returns the files written into ``out_dir``."""
    from inspect_ai.log import read_eval_log

    by_family: dict[str, list[Any]] = {}
    model = ""
    for eval_log in logs:
        samples = eval_log.samples
        if samples is None and eval_log.location:
            samples = read_eval_log(str(eval_log.location)).samples
        model = model or str(eval_log.eval.model)
        for sample in samples or []:
            family = (sample.metadata or {}).get("family")
            if family in family_names():
                by_family.setdefault(family, []).append(sample)
    written: list[Path] = []
    for family, samples in sorted(by_family.items()):
        report = get_family(family).load_report()
        if report is not None:
            written += report(samples, Path(out_dir), model)
    if written:
        log.info("event=family_reports files=%s", [str(p) for p in written])
    return written


def run_gate(
    candidate: str | Path,
    baseline: str | Path,
    policy: str | Path = "infra/gate.yaml",
    report_dir: str | Path = "reports/gate",
    human_preference: str | Path | None = None,
) -> tuple[GateVerdict, Path, Path]:
    """Read both sets of logs (and the blind-review summary, when given), apply the policy, write the Markdown
    and HTML reports."""
    from evalsuite.human_preference import load_human_preference

    summary = load_human_preference(human_preference) if human_preference is not None else None
    verdict = evaluate_gate(read_outcomes(candidate), read_outcomes(baseline), load_policy(policy), summary)
    markdown, page = write_reports(verdict, report_dir)
    return verdict, markdown, page
