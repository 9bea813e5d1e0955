"""The ``rlhfctl`` Typer application: commands, ``--version``, shell completion, and ``main``."""

from __future__ import annotations

from typing import Optional

import typer

import rlhfctl
from rlhfctl.cli.inspect_dispatch import inspect_dispatch
from rlhfctl.cli.pipeline import pipeline
from rlhfctl.cli.recipes import recipes_app
from rlhfctl.cli.train import train
from rlhfctl.cli.validate import validate

__all__ = ["app", "main"]

app = typer.Typer(
    name="rlhfctl",
    help=(
        "RLHF training from YAML recipes on a single controller whose data flow you can see.\n\n"
        "Start with: rlhfctl recipes list, then rlhfctl validate quickstart, then rlhfctl train quickstart."
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"rlhfctl {rlhfctl.__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_print_version, is_eager=True, help="print the version and exit"),
) -> None:
    """RLHF training from YAML recipes on a single controller whose data flow you can see."""


app.command("train")(train)
app.command("validate")(validate)
app.command("inspect-dispatch")(inspect_dispatch)
app.command("pipeline")(pipeline)
app.add_typer(recipes_app, name="recipes")


def main() -> None:
    """Console-script entry point (``rlhfctl``)."""
    app(prog_name="rlhfctl")
