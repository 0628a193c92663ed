"""The root ``lmembed`` command: every command group registered in one place, inside the error boundary."""

from __future__ import annotations

from typing import Annotated

import typer

from lmembed.cli import cache, encode, evaluate, mine, models, train
from lmembed.cli.boundary import DEBUG_ENV, GuardedGroup

app = typer.Typer(
    cls=GuardedGroup,
    help="lmembed: turn language models into text-embedding models; extract, train, evaluate.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def root(
    debug: Annotated[
        bool, typer.Option("--debug", envvar=DEBUG_ENV, help="Show the full traceback when a command fails.")
    ] = False,
) -> None:
    """lmembed: turn language models into text-embedding models; extract, train, evaluate."""


app.command("encode")(encode.encode)
app.command("models")(models.models)
app.add_typer(cache.app, name="cache")
app.command("eval")(evaluate.eval_command)
app.command("sweep")(evaluate.sweep)
app.command("report")(evaluate.report)
app.command("train")(train.train)
app.command("mine")(mine.mine)


def main() -> None:  # pragma: no cover - the console-script entry point
    app()
