"""Base vs SFT candidate on slices the SFT run did not train on: documents medium tier and terminal easy.

Reproduce: nice -n 10 .venv/bin/python bench/results/posttrain-sft-documents/measure.py
"""

import json
import logging
from pathlib import Path

from infra.registry import open_registry
from posttrain.config import EvalConfig
from posttrain.evaluation import measure_held_out

SLICES = [
    ("documents", EvalConfig(split="test", n_per_family=12, seed=0, max_new_tokens=24, difficulty="medium")),
    ("terminal", EvalConfig(split="test", n_per_family=12, seed=0, max_new_tokens=64, difficulty="easy")),
]

if __name__ == "__main__":
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    registry = open_registry()
    models = {"base": "smollm2-135m-instruct@base", "candidate": "tandem-candidate@sft-documents-r3"}
    results: dict[str, dict[str, float]] = {}
    for label, ref in models.items():
        path = registry.fetch(ref)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        for family, config in SLICES:
            report = measure_held_out(model, tokenizer, config, [family])  # type: ignore[list-item]
            results.setdefault(f"{family}/{config.difficulty}", {})[label] = report.pass_rate[family]
            logging.info("slice=%s/%s model=%s pass_rate=%.3f", family, config.difficulty, label,
                         report.pass_rate[family])
    (Path(__file__).parent / "cross_family.json").write_text(json.dumps(results, indent=2))
