"""Short real GRPO run from the SFT candidate, documents family (medium tier), verifier rewards.

Reproduce: nice -n 10 .venv/bin/python bench/results/posttrain-rl-documents/run.py
"""

import json
import logging
import time
from pathlib import Path

from posttrain.stages import RLRunConfig
from posttrain.rl import posttrain_rl

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    out = Path(__file__).parent
    config = RLRunConfig(
        base="tandem-candidate@sft-documents-r3",
        pool={"families": ["documents"], "instances_per_family": 120, "seed": 0, "start_tier": "medium",
              "tiers": True},
        num_generations=4,
        max_completion_length=24,
        temperature=1.0,
        train={"max_steps": 40, "batch_size": 2, "learning_rate": 1e-5, "max_length": 1800,
               "save_steps": 5, "time_budget_s": 600, "seed": 0},
        eval={"split": "test", "n_per_family": 8, "seed": 0, "max_new_tokens": 24, "difficulty": "medium"},
        output={"work_dir": "/tmp/tandem-posttrain-rl-documents", "version": "rl-documents-r1"},
    )
    started = time.time()
    result = posttrain_rl(config)
    summary = {**result.model_dump(), "wall_s": round(time.time() - started, 1), "config": config.model_dump()}
    (out / "result.json").write_text(json.dumps(summary, indent=2, default=str))
    for name in ("history.json", "curves.png"):
        source = Path(result.run_dir) / name
        if source.exists():
            (out / name).write_bytes(source.read_bytes())
