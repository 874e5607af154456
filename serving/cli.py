"""`tandem models`: prepare and list model artifacts."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console()
models_app = typer.Typer(
    help="Prepare the bundled model and list model artifacts in the registry.", no_args_is_help=True
)


@models_app.command("prepare")
def prepare(
    registry: Annotated[str | None, typer.Option(help="Registry URL (file:// or s3://).")] = None,
    force: Annotated[bool, typer.Option(help="Re-convert even when the cached copy verifies.")] = False,
) -> None:
    """Convert the bundled SmolLM2-135M-Instruct to safetensors (once) and publish it to the registry."""
    from infra.bundled import prepare_bundled_model, publish_bundled_model
    from infra.registry import open_registry

    with console.status("preparing the bundled model (GGUF -> safetensors)..."):
        path = prepare_bundled_model(force=force)
        manifest = publish_bundled_model(open_registry(registry))
    console.print(f"[green]ready[/] {manifest.ref}  ({manifest.total_size() / 1e6:.0f} MB, cache: {path})")


@models_app.command("list")
def list_models(
    registry: Annotated[str | None, typer.Option(help="Registry URL (file:// or s3://).")] = None,
    kind: Annotated[str | None, typer.Option(help="Only this kind: model, draft, ...")] = None,
) -> None:
    """List artifact versions in the registry."""
    from infra.registry import open_registry

    store = open_registry(registry)
    table = Table(title=f"artifacts in {store.url}")
    for column in ("ref", "kind", "size", "created", "parents"):
        table.add_column(column)
    for manifest in store.list(kind=kind):  # type: ignore[arg-type]
        table.add_row(
            manifest.ref,
            manifest.kind,
            f"{manifest.total_size() / 1e6:.1f} MB",
            manifest.created_at.strftime("%Y-%m-%d %H:%M"),
            ", ".join(manifest.lineage.parents),
        )
    console.print(table)
