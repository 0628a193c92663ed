"""The root ``lmembed`` command: every command group registered in one place, inside the error boundary."""

from __future__ import annotations

import logging
import os
from typing import Annotated

import typer

from lmembed import terminal
from lmembed.cli import (
    adapt,
    cache,
    decontaminate,
    doctor,
    encode,
    evaluate,
    experiment,
    export,
    index,
    mine,
    models,
    serve,
    synthesize,
    train,
)
from lmembed.cli.boundary import GuardedGroup
from lmembed.paths import DEBUG_ENV_VAR, VERBOSE_ENV_VAR

#: What lmembed is, as the root help says it.
ROOT_HELP = (
    "lmembed: turn language models into text-embedding models and put them to work. Extract embeddings with any "
    "pooling, layer or attention (encode, doctor), evaluate MTEB-exact (eval, sweep, report), train and mine "
    "hard negatives (train, mine, experiment), adapt a model to a corpus with nothing but the corpus (adapt), "
    "build, search and rerank indexes (index, search), serve an OpenAI-, Cohere- and TEI-compatible API (serve), "
    "export to ONNX and int8 (export); --engine ray scales encoding out."
)

app = typer.Typer(
    cls=GuardedGroup,
    help=ROOT_HELP,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


#: the name of the handler ``--verbose`` adds
STEP_LOG = "lmembed-step-log"


def show_step_log(verbose: bool) -> None:
    """With ``verbose``, lmembed's INFO log on stderr, each line stamped with the wall-clock time. Without, a step log
    left by an earlier command in the same process (as in tests) is taken down and the logger's level restored;
    a logger nobody made verbose is left as it is."""
    root = logging.getLogger("lmembed")
    ours = [h for h in root.handlers if h.get_name() == STEP_LOG]
    for handler in ours:
        root.removeHandler(handler)
    if ours:
        root.setLevel(getattr(ours[0], "level_before", logging.NOTSET))
    if verbose:
        handler = logging.StreamHandler()  # bound to the current stderr
        handler.set_name(STEP_LOG)
        handler.level_before = root.level  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)


@app.callback()
def root(
    debug: Annotated[
        bool, typer.Option("--debug", envvar=DEBUG_ENV_VAR, help="Show the full traceback when a command fails.")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            envvar=VERBOSE_ENV_VAR,
            help="Log each step with its time (model loading, exports, int8 calibration, each encode's texts/s).",
        ),
    ] = False,
) -> None:
    # the root help is ROOT_HELP (typer prefers a callback's docstring, so this callback has none)
    show_step_log(verbose)
    quiet_library_bars()


def quiet_library_bars() -> None:
    """In a log (stderr not a terminal) the Hugging Face libraries' own tqdm bars (loading weights, writing
    shards) would each leave a line of carriage returns; lmembed's progress lines say what runs. Set before they
    are imported (commands import them lazily); an explicit HF_HUB_DISABLE_PROGRESS_BARS is left as it is."""
    if not terminal.is_terminal():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


app.command("encode")(encode.encode)
app.command("models")(models.models)
app.command("doctor")(doctor.doctor)
app.add_typer(cache.app, name="cache")
app.command("eval")(evaluate.eval_command)
app.command("sweep")(evaluate.sweep)
app.command("report")(evaluate.report)
app.command("train")(train.train)
app.command("adapt")(adapt.adapt)
app.command("experiment")(experiment.experiment)
app.command("mine")(mine.mine)
app.command("decontaminate")(decontaminate.decontaminate_command)
app.command("synthesize")(synthesize.synthesize_command)
app.add_typer(index.app, name="index")
app.command("search")(index.search)
app.command("serve")(serve.serve)
app.command("export")(export.export)


def main() -> None:  # pragma: no cover - the console-script entry point
    app()
