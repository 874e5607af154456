"""`tandem`: one typer app, a thin shell over each package's public functions.

Each package contributes its commands from its own ``cli.py``; this module only assembles them and maps
:class:`infra.errors.TandemError` to a readable message and an exit code, once, for every command.
"""

from __future__ import annotations

import sys
from typing import cast

import typer
from rich.console import Console
from rich.markup import escape

from infra import lifecycle
from infra.errors import TandemError

console = Console(stderr=True)

app = typer.Typer(
    name="tandem",
    help="Tandem: a dual-tier model gateway (standard + speculative fast tier), its evals and post-training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    from gateway.cli import serve_command
    from serving.cli import models_app

    app.command("serve")(serve_command)
    app.add_typer(models_app, name="models")

    from evalsuite.cli import eval_command, gate_command

    app.command("eval")(eval_command)
    app.command("gate")(gate_command)

    from distill.cli import distill_command

    app.command("distill")(distill_command)

    from posttrain.cli import posttrain_app

    app.add_typer(posttrain_app, name="posttrain")

    from gateway.keys_cli import keys_app

    app.add_typer(keys_app, name="keys")

    from release.rollout_cli import rollout_app

    app.add_typer(rollout_app, name="rollout")

    from release.release_cli import release_command

    app.command("release")(release_command)

    from cli.bench import bench_app

    app.add_typer(bench_app, name="bench")

    from feedback.review.cli import review_app

    app.add_typer(review_app, name="review")

    from feedback.cli import traffic_app

    app.add_typer(traffic_app, name="traffic")


_register()


def main() -> None:
    """Console-script entry point with TandemError mapped to exit codes."""
    import logging

    # Ray configures the root logger at INFO; per-request client logs would drown the CLI's output.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # SIGTERM and Ctrl-C unwind every command like Ctrl-C; a second one forces the exit (infra.lifecycle).
    lifecycle.install()
    try:
        # Without standalone mode click returns a command's `typer.Exit(code)` instead of exiting with it.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code != 0:
            sys.exit(code)
    except TandemError as exc:
        # One line, never wrapped, and the message's own brackets are text, not rich markup.
        console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except (typer.Abort, lifecycle.Stop) as exc:
        # click turns a KeyboardInterrupt (our Stop) into Abort, keeping it as the cause.
        stop = exc if isinstance(exc, lifecycle.Stop) else exc.__cause__
        if isinstance(stop, lifecycle.Stop):
            console.print(f"stopped ({stop.name}); checkpointed work resumes with the same command")
            sys.exit(stop.exit_code)
        console.print("aborted")
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # click's own usage errors arrive here in non-standalone mode
        if isinstance(exc, _click_exceptions()):
            import click

            usage_error = cast(click.ClickException, exc)  # the vendored class has click's interface
            usage_error.show()
            sys.exit(usage_error.exit_code)
        raise


def _click_exceptions() -> tuple[type[Exception], ...]:
    """Usage-error classes: typer >= 0.26 vendors click as ``typer._click``, so its errors are not ``click``'s."""
    import click

    classes: list[type[Exception]] = [click.ClickException]
    try:
        from typer._click.exceptions import ClickException as TyperClickException
    except ImportError:  # an older typer that uses click itself
        pass
    else:
        classes.append(TyperClickException)
    return tuple(classes)


if __name__ == "__main__":
    main()
