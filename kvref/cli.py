"""The `kvref` command line (a thin typer layer over plain `main(argv) -> int` functions)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvref import __version__

__all__ = ["app"]

app = typer.Typer(
    name="kvref",
    help="A typed KV-cache offload reference, and a checker that keeps class hierarchies honest.",
    no_args_is_help=True,
    add_completion=False,
    # A CI tool must never print a rich traceback with locals: errors exit 2 with one line.
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kvref {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """kvref: KV-cache offload reference and `kvref audit`."""


# --- demo (transfer area) ---


@app.command(
    "demo",
    # Options are parsed by kvref.demo's own argparse parser (`kvref demo --help`).
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def _demo(ctx: typer.Context) -> None:
    """Run the end-to-end offload demo: offload, evict, reload into other GPU blocks, verify."""
    # Imported here: the demo needs torch, the rest of the CLI must not.
    from kvref.demo import main as demo_main

    raise typer.Exit(demo_main(ctx.args))
