"""Short real SFT run on the bundled model, documents family; held-out pass rate before/after.

Reproduce: nice -n 10 .venv/bin/python bench/results/posttrain-sft-documents/run.py
"""

import json
import logging
import time
from pathlib import Path

from posttrain.stages import SFTRunConfig
from posttrain.sft import posttrain_sft

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    out = Path(__file__).parent
    config = SFTRunConfig(
        base="smollm2-135m-instruct@base",
        pool={"families": ["documents"], "instances_per_family": 400, "seed": 0, "start_tier": "easy"},
        train={"max_steps": 300, "batch_size": 2, "learning_rate": 1e-4, "max_length": 512,
               "save_steps": 10, "time_budget_s": 840, "seed": 0},
        eval={"split": "test", "n_per_family": 12, "seed": 0, "max_new_tokens": 24,
              "difficulty": "easy"},
        output={"work_dir": "/tmp/tandem-posttrain-sft-documents", "version": "sft-documents-r3"},
    )
    started = time.time()
    result = posttrain_sft(config)
    summary = {**result.model_dump(), "wall_s": round(time.time() - started, 1), "config": config.model_dump()}
    (out / "result.json").write_text(json.dumps(summary, indent=2, default=str))
    for name in ("history.json", "curves.png"):
        source = Path(result.run_dir) / name
        if source.exists():
            (out / name).write_bytes(source.read_bytes())
