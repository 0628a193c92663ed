"""The root ``lmembed`` command: every command group registered in one place, inside the error boundary."""

from __future__ import annotations

from typing import Annotated

import typer

from lmembed.cli import cache, encode, evaluate, experiment, export, index, mine, models, serve, train
from lmembed.cli.boundary import GuardedGroup
from lmembed.paths import DEBUG_ENV_VAR

app = typer.Typer(
    cls=GuardedGroup,
    help="lmembed: turn language models into text-embedding models; extract, train, evaluate.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def root(
    debug: Annotated[
        bool, typer.Option("--debug", envvar=DEBUG_ENV_VAR, help="Show the full traceback when a command fails.")
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
app.command("experiment")(experiment.experiment)
app.command("mine")(mine.mine)
app.add_typer(index.app, name="index")
app.command("search")(index.search)
app.command("serve")(serve.serve)
app.command("export")(export.export)


def main() -> None:  # pragma: no cover - the console-script entry point
    app()
