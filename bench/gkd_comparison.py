"""Measure one on-policy distillation step: TRL's ``GKDTrainer`` against :class:`DraftDistiller`.

Same teacher, same layer-subset draft, same batch (prompts x new tokens), fully on-policy (lmbda=1),
JSD beta=0.5, CPU. Writes ``bench/results/distill_gkd_comparison.json``. Run with
``python -m bench.gkd_comparison`` (it takes a few minutes on 2 cores).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def _time_own_loop(
    teacher_dir: Path, draft_dir: Path, steps: int, batch_size: int, new_tokens: int
) -> list[float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distill.config import DistillConfig
    from distill.prompts import load_prompts
    from distill.training import DraftDistiller

    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32)
    config = DistillConfig(
        teacher="comparison", batch_size=batch_size, max_new_tokens=new_tokens, steps=steps
    )
    distiller = DraftDistiller(config, teacher, draft, tokenizer, load_prompts(split="train"), [])
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        distiller.train_step("jsd")
        times.append(time.perf_counter() - started)
    return times


def _time_gkd_trainer(
    teacher_dir: Path, draft_dir: Path, steps: int, batch_size: int, new_tokens: int
) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from distill.prompts import load_prompts

    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    prompts = load_prompts(split="train")[: steps * batch_size]
    dataset = Dataset.from_list(
        [
            {"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": "OK."}]}
            for p in prompts
        ]
    )
    times: list[float] = []

    class StepTimer(TrainerCallback):
        started = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter() - self.started)

    with tempfile.TemporaryDirectory() as output_dir:
        args = GKDConfig(
            output_dir=output_dir,
            per_device_train_batch_size=batch_size,
            max_steps=steps,
            max_new_tokens=new_tokens,
            lmbda=1.0,
            beta=0.5,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            bf16=True,
            max_length=96 + new_tokens,
        )
        trainer = GKDTrainer(
            model=AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32),
            teacher_model=AutoModelForCausalLM.from_pretrained(teacher_dir),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepTimer()],
        )
        trainer.train()
    return times


def compare(
    teacher_dir: Path, keep_layers: list[int], *, steps: int = 3, batch_size: int = 8, new_tokens: int = 64
) -> dict[str, Any]:
    """Median seconds per step of both loops (first step dropped as warm-up when there are several)."""
    from distill.draft_init import build_layer_subset_draft

    with tempfile.TemporaryDirectory() as scratch:
        draft_dir = build_layer_subset_draft(teacher_dir, Path(scratch) / "draft", keep_layers)
        own = _time_own_loop(teacher_dir, draft_dir, steps, batch_size, new_tokens)
        gkd = _time_gkd_trainer(teacher_dir, draft_dir, steps, batch_size, new_tokens)

    def median(values: list[float]) -> float:
        kept = sorted(values[1:] if len(values) > 1 else values)
        return kept[len(kept) // 2]

    return {
        "batch_size": batch_size,
        "new_tokens": new_tokens,
        "steps": steps,
        "own_loop_seconds_per_step": round(median(own), 3),
        "gkd_trainer_seconds_per_step": round(median(gkd), 3),
        "own_loop_step_times": [round(t, 3) for t in own],
        "gkd_trainer_step_times": [round(t, 3) for t in gkd],
        "speedup_own_over_gkd": round(median(gkd) / median(own), 2),
        "note": "same CPU, measured one after the other; the machine is shared, so treat as indicative",
    }


def main() -> None:
    from infra.bundled import prepare_bundled_model

    logging.basicConfig(level=logging.INFO)
    result = compare(prepare_bundled_model(), [0, 10, 19, 29])
    out = Path(__file__).resolve().parent / "results" / "distill_gkd_comparison.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    log.info("event=gkd_comparison result=%s", json.dumps(result))


if __name__ == "__main__":
    main()
