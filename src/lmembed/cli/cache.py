"""``lmembed cache info|clear``: inspect or empty the embedding cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lmembed import terminal
from lmembed.paths import embedding_cache_dir

app = typer.Typer(help="Inspect or clear the embedding cache.", no_args_is_help=True)
DirectoryOpt = Annotated[
    Path | None, typer.Option(help="Cache folder (default: $LMEMBED_CACHE, else $LMEMBED_HOME/embeddings).")
]


@app.command("clear")
def clear(
    directory: DirectoryOpt = None,
    damaged: Annotated[
        bool,
        typer.Option(
            "--damaged",
            help="Remove only the shards that cannot be read as lmembed wrote them (damaged, truncated, links, "
            "non-finite vectors), which every run skips with a warning; the others stay.",
        ),
    ] = False,
) -> None:
    """Delete every cached embedding: the cache's own model folders (anything else in the folder is left)."""
    from lmembed.encoding.cache import clear_cache, clear_damaged  # lazy: keeps --help fast

    err = terminal.console(stderr=True)
    where = directory or embedding_cache_dir()
    if damaged:
        removed_shards = clear_damaged(directory)
        for shard, why in removed_shards:
            err.print(f"removed {shard}: {why}", markup=False, highlight=False)
        err.print(f"removed {len(removed_shards)} damaged cache shard(s) from {where}", markup=False, highlight=False)
        return
    removed = clear_cache(directory)
    err.print(f"removed {removed} cache shard(s) from {where}", markup=False, highlight=False)


@app.command("info")
def info(directory: DirectoryOpt = None) -> None:
    """Show where the cache is and how big it is."""
    from lmembed.encoding.cache import cache_size  # lazy: keeps --help fast

    files, size = cache_size(directory)
    terminal.console(stderr=True).print(
        f"{directory or embedding_cache_dir()}: {files} shard(s), {size / 2**20:.1f} MiB"
    )
