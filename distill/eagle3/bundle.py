"""Ship a published EAGLE-3 head of the bundled model with the code (``infra/bundled_drafts/``).

A fresh clone has no registry but the one ``make serve`` seeds, so without a shipped head its fast tier
would speculate with n-gram lookup. This copies a head from the registry into the repository in bfloat16
(half the bytes; vLLM casts a draft to the served dtype when it loads it), with its report, curve and a
``draft.json`` that ``infra.bundled.publish_bundled_drafts`` publishes under the same ref and metadata.

    python -m distill.eagle3.bundle smollm2-135m-instruct-eagle3@r2
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from distill.eagle3.api import REPORT_NAME
from distill.eagle3.curves import CURVE_NAME
from distill.eagle3.head import Eagle3Head, is_eagle3_dir
from infra.bundled import BUNDLED_DRAFTS, BUNDLED_REF, DRAFT_SPEC
from infra.errors import TandemError
from infra.registry import Registry, open_registry


def bundle_draft(registry: Registry, ref: str, *, out_root: Path = BUNDLED_DRAFTS) -> Path:
    """Write ``ref`` (an EAGLE-3 head drafted from the bundled model) to ``out_root/<name>@<version>``."""
    manifest = registry.manifest(ref)
    if manifest.kind != "draft" or BUNDLED_REF not in manifest.lineage.parents:
        raise TandemError(f"{manifest.ref} is not a draft of {BUNDLED_REF}")
    source = registry.fetch(manifest.ref)
    if not is_eagle3_dir(source):
        raise TandemError(f"{manifest.ref} is not an EAGLE-3 head")
    target = out_root / manifest.ref
    if target.exists():
        shutil.rmtree(target)
    Eagle3Head.load_vllm(source).save_vllm(target, dtype=torch.bfloat16)
    for name in (REPORT_NAME, CURVE_NAME):
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    spec = {
        "metadata": manifest.metadata,
        "produced_by": manifest.lineage.produced_by,
        "config": manifest.lineage.config,
    }
    (target / DRAFT_SPEC).write_text(json.dumps(spec, indent=2) + "\n")
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "ref", help="The draft to ship, 'name@version' (e.g. smollm2-135m-instruct-eagle3@r2)."
    )
    parser.add_argument("--registry", default=None, help="Registry URL; default: open_registry()'s.")
    args = parser.parse_args(argv)
    print(bundle_draft(open_registry(args.registry), args.ref))


if __name__ == "__main__":
    main()
