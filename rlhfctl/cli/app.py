"""The ``rlhfctl`` Typer application: commands, ``--version``, shell completion, and ``main``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Optional

import typer
from typer.core import TyperGroup

import rlhfctl
from rlhfctl.cli.console import make_console, print_error
from rlhfctl.cli.errors import EXIT_INTERRUPTED, EXIT_USER, click_exceptions, usage_message
from rlhfctl.cli.evaluate import evaluate_command
from rlhfctl.cli.generate import generate_command
from rlhfctl.cli.inspect_dispatch import inspect_dispatch
from rlhfctl.cli.pipeline import pipeline
from rlhfctl.cli.plot import plot
from rlhfctl.cli.recipes import recipes_app
from rlhfctl.cli.train import train
from rlhfctl.cli.validate import validate

__all__ = ["app", "main"]


class OneLineErrors(TyperGroup):
    """The command group whose usage errors (a bad option value, a missing argument) print the one-line
    ``error: <option>: <what is wrong>`` that every other user error prints, and exit 2."""

    def main(self, args: Optional[Sequence[str]] = None, prog_name: Optional[str] = None,
             complete_var: Optional[str] = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        clicks = click_exceptions()
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except getattr(clicks, "NoArgsIsHelpError", ()) as shown:
            shown.show()  # the help text, as click shows it
            sys.exit(0)
        except clicks.UsageError as error:
            print_error(make_console(stderr=True), usage_message(error))
            sys.exit(EXIT_USER)
        except clicks.ClickException as error:
            print_error(make_console(stderr=True), " ".join(error.format_message().split()))
            sys.exit(error.exit_code)
        except typer.Abort:
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(result if isinstance(result, int) else 0)


app = typer.Typer(
    cls=OneLineErrors,
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
app.command("plot")(plot)
app.command("eval")(evaluate_command)
app.command("generate")(generate_command)
app.add_typer(recipes_app, name="recipes")


def main() -> None:
    """Console-script entry point (``rlhfctl``)."""
    app(prog_name="rlhfctl")
