"""The command line's one error boundary.

Any error raised while a command runs ends here: the user sees one short message (naming the argument,
the file and line, or the HTTP field, as the library's error says) and a non-zero exit status, never a
traceback. ``lmembed --debug ...`` or ``LMEMBED_DEBUG=1`` lets the exception through with its traceback.

Exit status: 2 for a problem with the input, 1 for anything else (a bug: the message says so and how to see
the traceback), 130 when interrupted. A closed pipe on output (``lmembed ... | head``) ends quietly with 1.
What counts as a problem with the input is :data:`USER_ERRORS`:

- :class:`~lmembed.errors.LmembedError` and its subclasses: the library raises these on purpose for a bad
  option value, missing or malformed data, an unusable model, naming the argument or the file and line;
- the operating system's refusals of a path: a missing file, no permission, a file where a folder is
  expected or the reverse, a name that already exists. They name the path, and a path comes from the user;
- click's usage errors (an unknown option, a bad ``--x`` value) never reach this module: typer prints them
  with the usage line and exits 2 itself.

A builtin ``ValueError``, ``TypeError``, ``KeyError`` or ``RuntimeError`` is *not* a user error: where a
user's mistake can surface as one (parsing a file, converting a value), the library catches it there and
raises an ``LmembedError`` subclass that names the file, line or argument. One that arrives here unconverted
is a bug and is reported as one.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from lmembed import terminal
from lmembed.errors import LmembedError, Terminated, sigterm_interrupts
from lmembed.paths import DEBUG_ENV_VAR, debug_from_env

#: Most lines of an error message shown (a message that lists the places it looked may be long).
MAX_LINES = 12

#: Errors that describe a problem with what the user gave (exit status 2); anything else is a bug (1).
USER_ERRORS: tuple[type[BaseException], ...] = (
    LmembedError,
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)

_console = terminal.console(stderr=True, highlight=False, soft_wrap=True)


def debug_enabled(ctx: typer.Context | None = None) -> bool:
    """True when ``--debug`` was given to the root command or ``LMEMBED_DEBUG`` is set to a true value."""
    while ctx is not None:
        if ctx.params.get("debug"):
            return True
        ctx = ctx.parent
    return debug_from_env()


def describe(exc: BaseException) -> str:
    """The message for ``exc``: its own text, with the file name for OS errors that carry one."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        return str(exc.args[0])  # str(KeyError) wraps the message in quotes
    text = str(exc).strip()
    return text or type(exc).__name__


def report(exc: BaseException) -> int:
    """Print ``exc`` as a short message and return the exit status for it."""
    lines = describe(exc).splitlines() or [type(exc).__name__]
    if len(lines) > MAX_LINES:
        lines = [*lines[:MAX_LINES], f"... ({len(lines) - MAX_LINES} more lines)"]
    if isinstance(exc, USER_ERRORS):
        _console.print(f"[red]error:[/red] {escape(lines[0])}")
        status = 2
    else:
        _console.print(f"[red]internal error[/red] ({type(exc).__name__}): {escape(lines[0])}")
        status = 1
    for line in lines[1:]:
        _console.print(escape(line))
    hint = "" if status == 2 else " (please report it)"
    _console.print(f"[dim]run with --debug or {DEBUG_ENV_VAR}=1 for the traceback{hint}[/dim]")
    return status


def closed_pipe() -> int:
    """The reader of our output went away (``lmembed ... | head``): not an error to report. As Python's docs
    advise (signal module, "Note on SIGPIPE"), what is left to flush goes to ``os.devnull`` so the interpreter's
    exit does not raise again; the status is 1, as click gives for the same case while printing help."""
    for stream in (sys.stdout, sys.stderr):
        try:
            fileno = stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue  # replaced or closed (a test runner's capture): nothing will be flushed to a pipe
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fileno)
        os.close(devnull)
    return 1


def guarded(ctx: typer.Context, call: Callable[[], Any]) -> Any:
    """Run ``call``; turn any exception that is not typer's own into a message and an exit status."""
    try:
        with sigterm_interrupts():  # a scheduler's stop flushes what is done, as Ctrl-C does
            return call()
    except (typer.TyperException, typer.Exit, typer.Abort):
        raise  # typer prints these itself (usage + "Invalid value for '--x'"), or they are a normal exit
    except Terminated:
        _console.print("[yellow]terminated (SIGTERM)[/yellow]")
        raise typer.Exit(143) from None
    except KeyboardInterrupt:
        _console.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130) from None
    except BrokenPipeError:
        raise typer.Exit(closed_pipe()) from None
    except Exception as exc:
        if debug_enabled(ctx):
            raise
        raise typer.Exit(report(exc)) from None


class GuardedGroup(TyperGroup):
    """The root command group: every sub-command runs inside the boundary. Its command list shows each command's
    first paragraph as one flowing line (typer would keep the docstring's line breaks there)."""

    def invoke(self, ctx: typer.Context) -> Any:
        return guarded(ctx, lambda: super(GuardedGroup, self).invoke(ctx))

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.help and not command.short_help:
            command.short_help = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
        return command


class GuardedCommand(TyperCommand):
    """A single command run on its own (``python -m lmembed.cli.train``), inside the boundary."""

    def invoke(self, ctx: typer.Context) -> Any:
        return guarded(ctx, lambda: super(GuardedCommand, self).invoke(ctx))
