"""Paired release gate: candidate vs baseline per family on the same samples, plus fast/standard parity.

Statistics: the mean paired difference (candidate - baseline) with a percentile bootstrap confidence
interval over samples; for binary outcomes also the exact McNemar test on the discordant pairs. A family
passes non-inferiority when the interval's lower bound is above ``-margin`` and it has ``min_samples``
pairs. Parity requires the candidate's fast and standard tiers to differ by less than ``margin`` either way.
The optional human-preference row (a blind-review summary, :mod:`evalsuite.human_preference`) is non-inferior when
the candidate's win rate (ties half) has its lower bound at least ``0.5 - non_inferiority_margin``.
"""

from __future__ import annotations

import logging
import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from evalsuite.errors import GateError
from evalsuite.human_preference import (
    HumanPreferencePolicy,
    HumanPreferenceResult,
    HumanPreferenceSummary,
    win_rate_interval,
)
from evalsuite.registry import family_names

log = logging.getLogger(__name__)


class FamilyPolicy(BaseModel):
    margin: float = Field(default=0.05, ge=0.0, le=1.0, description="Largest tolerated drop vs baseline.")
    min_samples: int = Field(default=30, ge=1, description="Fewer paired samples than this fails the family.")


class ParityPolicy(BaseModel):
    required: bool = Field(default=True, description="Fail when the candidate lacks either tier.")
    fast_model: str = "tandem-fast"
    standard_model: str = "tandem-standard"
    margin: float = Field(default=0.03, ge=0.0, le=1.0, description="Largest tolerated |fast - standard|.")


class GatePolicy(BaseModel):
    """Gate thresholds (``infra/gate.yaml``)."""

    metric: Literal["correct", "score"] = "correct"
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    bootstrap_resamples: int = Field(default=2000, ge=100)
    seed: int = 0
    families: dict[str, FamilyPolicy] = Field(
        default_factory=lambda: {f: FamilyPolicy() for f in family_names()},
        description="Families the gate checks, with their thresholds (default: every registered family).",
    )
    parity: ParityPolicy = Field(default_factory=ParityPolicy)
    human_preference: HumanPreferencePolicy = Field(
        default_factory=HumanPreferencePolicy,
        description="Blind-review row: reported when a summary is given; required makes it a release condition.",
    )

    @field_validator("families")
    @classmethod
    def _registered(cls, families: dict[str, FamilyPolicy]) -> dict[str, FamilyPolicy]:
        unknown = sorted(set(families) - set(family_names()))
        if unknown:
            raise ValueError(f"unknown families {unknown} (allowed: {', '.join(family_names())})")
        return families


class SampleOutcome(BaseModel):
    family: str
    model: str
    sample_id: str
    epoch: int
    score: float
    correct: bool


class PairedComparison(BaseModel):
    """Statistics of one paired comparison (a minus b) on the shared samples."""

    n: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    discordant_a_only: int = Field(description="Pairs where only a succeeded (McNemar c).")
    discordant_b_only: int = Field(description="Pairs where only b succeeded (McNemar b).")
    mcnemar_p: float


class GateCheck(BaseModel):
    name: str
    kind: Literal["non_inferiority", "parity", "coverage", "human_preference"]
    family: str
    passed: bool
    reason: str
    margin: float = 0.0
    comparison: PairedComparison | None = None
    preference: HumanPreferenceResult | None = Field(
        default=None, description="The human-preference row's figures (kind human_preference only)."
    )


class GateVerdict(BaseModel):
    passed: bool
    checks: list[GateCheck]
    candidate_models: list[str]
    baseline_models: list[str]
    policy: GatePolicy


# ---------------------------------------------------------------- reading logs
def read_outcomes(path: str | Path) -> list[SampleOutcome]:
    """Every scored sample in an Inspect log file or a directory of logs (errored samples count as 0)."""
    from inspect_ai.log import list_eval_logs, read_eval_log

    path = Path(path)
    if path.is_dir():
        files = [info.name for info in list_eval_logs(str(path))]
    elif path.is_file():
        files = [str(path)]
    else:
        raise GateError(f"{path}: no such log file or directory")
    if not files:
        raise GateError(f"{path}: contains no Inspect logs")
    outcomes: list[SampleOutcome] = []
    for file in files:
        try:
            eval_log = read_eval_log(file)
        except Exception as exc:
            raise GateError(f"{file}: not a readable Inspect log: {exc}") from exc
        model = eval_log.eval.model.split("/")[-1]
        for sample in eval_log.samples or []:
            family = (sample.metadata or {}).get("family")
            if family is None:
                continue
            score, correct = 0.0, False
            if sample.scores and sample.error is None:
                first = next(iter(sample.scores.values()))
                score = float(first.value) if isinstance(first.value, int | float) else 0.0
                correct = bool((first.metadata or {}).get("correct", False))
            outcomes.append(SampleOutcome(family=family, model=model, sample_id=str(sample.id),
                                          epoch=sample.epoch, score=score, correct=correct))  # fmt: skip
    log.info("event=gate_read path=%s samples=%d", path, len(outcomes))
    return outcomes


# ---------------------------------------------------------------- statistics
def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of min(b, c) among b + c discordant pairs at 1/2."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_comparison(
    a: list[float], b: list[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> PairedComparison:
    """Mean of a - b with a percentile bootstrap CI over the pairs; McNemar counts on values >= 0.5."""
    if len(a) != len(b) or not a:
        raise GateError("paired comparison needs two equally long, non-empty lists")
    n = len(a)
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    alpha = (1 - confidence) / 2
    low = means[math.floor(alpha * (resamples - 1))]
    high = means[math.ceil((1 - alpha) * (resamples - 1))]
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x >= 0.5 > y)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if y >= 0.5 > x)
    return PairedComparison(
        n=n, mean_a=sum(a) / n, mean_b=sum(b) / n, diff=sum(diffs) / n, ci_low=low, ci_high=high,
        discordant_a_only=a_only, discordant_b_only=b_only, mcnemar_p=mcnemar_exact_p(b_only, a_only),
    )  # fmt: skip


def _values(outcomes: list[SampleOutcome], metric: str) -> dict[tuple[str, int], float]:
    return {(o.sample_id, o.epoch): (float(o.correct) if metric == "correct" else o.score) for o in outcomes}


def _by(outcomes: list[SampleOutcome]) -> dict[str, dict[str, list[SampleOutcome]]]:
    grouped: dict[str, dict[str, list[SampleOutcome]]] = defaultdict(lambda: defaultdict(list))
    for outcome in outcomes:
        grouped[outcome.model][outcome.family].append(outcome)
    return grouped


def _compare(
    a: list[SampleOutcome], b: list[SampleOutcome], policy: GatePolicy
) -> tuple[PairedComparison | None, int]:
    va, vb = _values(a, policy.metric), _values(b, policy.metric)
    keys = sorted(set(va) & set(vb))
    if not keys:
        return None, 0
    comparison = paired_comparison([va[k] for k in keys], [vb[k] for k in keys], policy.confidence,
                                   policy.bootstrap_resamples, policy.seed)  # fmt: skip
    return comparison, len(keys)


def _model_pairs(candidate: list[str], baseline: list[str]) -> list[tuple[str, str]]:
    shared = [m for m in candidate if m in baseline]
    if shared:
        return [(m, m) for m in shared]
    if len(candidate) == 1 and len(baseline) == 1:
        return [(candidate[0], baseline[0])]
    raise GateError(f"cannot pair candidate models {candidate} with baseline models {baseline}")


def evaluate_gate(
    candidate: list[SampleOutcome],
    baseline: list[SampleOutcome],
    policy: GatePolicy,
    human_preference: HumanPreferenceSummary | None = None,
) -> GateVerdict:
    """Apply ``policy`` to candidate and baseline outcomes (and a blind-review summary, when given or
    required); pure, so tests need no logs."""
    cand, base = _by(candidate), _by(baseline)
    if not cand or not base:
        raise GateError("candidate and baseline logs must both contain scored evalsuite samples")
    checks: list[GateCheck] = []
    for cand_model, base_model in _model_pairs(sorted(cand), sorted(base)):
        for family, family_policy in sorted(policy.families.items()):
            name = f"{family} [{cand_model} vs {base_model}]"
            comparison, n = _compare(
                cand[cand_model].get(family, []), base[base_model].get(family, []), policy
            )
            if comparison is None or n < family_policy.min_samples:
                checks.append(GateCheck(name=name, kind="coverage", family=family, passed=False,
                                        margin=family_policy.margin, comparison=comparison,
                                        reason=f"{n} paired samples < minimum {family_policy.min_samples}"))  # fmt: skip
                continue
            ok = comparison.ci_low > -family_policy.margin
            reason = (
                f"difference {comparison.diff:+.3f}, {policy.confidence:.0%} CI [{comparison.ci_low:+.3f}, "
                f"{comparison.ci_high:+.3f}] {'above' if ok else 'reaches below'} -margin {-family_policy.margin:+.3f}"
            )
            checks.append(GateCheck(name=name, kind="non_inferiority", family=family, passed=ok,
                                    margin=family_policy.margin, comparison=comparison, reason=reason))  # fmt: skip
    checks += _parity_checks(cand, policy)
    if human_preference is not None or policy.human_preference.required:
        checks.append(human_preference_check(human_preference, policy))
    verdict = GateVerdict(passed=all(c.passed for c in checks), checks=checks, candidate_models=sorted(cand),
                          baseline_models=sorted(base), policy=policy)  # fmt: skip
    log.info("event=gate_verdict passed=%s checks=%d failed=%d", verdict.passed, len(checks),
             sum(not c.passed for c in checks))  # fmt: skip
    return verdict


def _parity_checks(cand: dict[str, dict[str, list[SampleOutcome]]], policy: GatePolicy) -> list[GateCheck]:
    parity = policy.parity
    fast = next((m for m in cand if m.endswith(parity.fast_model)), None)
    standard = next((m for m in cand if m.endswith(parity.standard_model)), None)
    if fast is None or standard is None:
        return [GateCheck(name="parity", kind="parity", family="*", passed=not parity.required, margin=parity.margin,
                          reason=f"candidate logs lack {parity.fast_model if fast is None else parity.standard_model}"
                          + (" (parity required)" if parity.required else " (parity optional: skipped)"))]  # fmt: skip
    checks = []
    for family in sorted(policy.families):
        comparison, n = _compare(cand[fast].get(family, []), cand[standard].get(family, []), policy)
        if comparison is None:
            checks.append(GateCheck(name=f"parity {family}", kind="parity", family=family, passed=not parity.required,
                                    margin=parity.margin, reason="no shared samples between tiers"))  # fmt: skip
            continue
        ok = -parity.margin < comparison.ci_low and comparison.ci_high < parity.margin
        reason = (
            f"fast - standard {comparison.diff:+.3f}, CI [{comparison.ci_low:+.3f}, {comparison.ci_high:+.3f}] "
            f"{'within' if ok else 'not within'} +-{parity.margin:.3f} on {n} samples"
        )
        checks.append(GateCheck(name=f"parity {family}", kind="parity", family=family, passed=ok,
                                margin=parity.margin, comparison=comparison, reason=reason))  # fmt: skip
    return checks


def human_preference_check(summary: HumanPreferenceSummary | None, policy: GatePolicy) -> GateCheck:
    """The human-preference row: non-inferior when the win rate's lower bound reaches ``0.5 - margin``.

    The interval is recomputed from the per-pair scores at the policy's confidence, resamples and seed, so the
    row does not depend on how the file was written. Not required, the row is reported and always passes.
    """
    settings = policy.human_preference
    margin, threshold = settings.non_inferiority_margin, 0.5 - settings.non_inferiority_margin
    optional = "" if settings.required else " (human preference optional: not a release condition)"
    if summary is None:
        return GateCheck(name="human preference", kind="human_preference", family="*", passed=False, margin=margin,
                         reason="required, but no human-preference summary was given (--human-preference FILE)")  # fmt: skip
    name = f"human preference [{summary.session_id}]"
    scores = [pair.score for pair in summary.pairs if pair.n_votes]
    result = HumanPreferenceResult(
        session_id=summary.session_id, n_pairs=len(scores), n_votes=summary.n_votes,
        reviewers=summary.reviewers, win_rate=None, ci_low=None, ci_high=None, threshold=threshold,
        fleiss_kappa=summary.fleiss_kappa,
    )  # fmt: skip
    if len(scores) < settings.min_pairs:
        return GateCheck(name=name, kind="human_preference", family="*", passed=not settings.required,
                         margin=margin, preference=result,
                         reason=f"{len(scores)} reviewed pairs < minimum {settings.min_pairs}{optional}")  # fmt: skip
    rate, low, high = win_rate_interval(scores, policy.confidence, policy.bootstrap_resamples, policy.seed)
    result = result.model_copy(update={"win_rate": rate, "ci_low": low, "ci_high": high})
    ok = low >= threshold
    kappa = "n/a" if summary.fleiss_kappa is None else f"{summary.fleiss_kappa:.2f}"
    reason = (
        f"candidate win rate {rate:.3f} (ties half), {policy.confidence:.0%} CI [{low:.3f}, {high:.3f}] "
        f"{'at or above' if ok else 'reaches below'} 0.5 - margin = {threshold:.3f} on {len(scores)} pairs, "
        f"{summary.reviewers} reviewers, Fleiss kappa {kappa}{optional}"
    )
    return GateCheck(name=name, kind="human_preference", family="*", passed=ok or not settings.required,
                     margin=margin, preference=result, reason=reason)  # fmt: skip


def load_policy(path: str | Path) -> GatePolicy:
    from infra.config import load_model_file

    return load_model_file(Path(path), GatePolicy)
