"""Progress bars for `gridmem demo` and the benchmarks.

rich draws a live bar when the stream is a terminal. When it is a pipe or a file
(a log, CI) rich writes each step once, when it ends, and we leave the bar out:
one plain line, "label  done/total  elapsed", with no carriage returns and no
escape codes (hand-written `\\r` bars filled logs with half-drawn lines).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn
from rich.progress import MofNCompleteColumn
from rich.progress import Progress
from rich.progress import TextColumn
from rich.progress import TimeElapsedColumn

LABEL_WIDTH = 34


@contextmanager
def step(out: TextIO, label: str, total: int) -> Iterator[Callable[[int], None]]:
    """One bar from 0 to `total`; yields a function that sets how much is done."""
    console = Console(file=out, highlight=False)
    bar_column = (BarColumn(bar_width=30),) if console.is_terminal else ()
    columns = (
        TextColumn("  {task.description}", markup=False),
        *bar_column,
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, refresh_per_second=4) as bar:
        task = bar.add_task(f"{label:<{LABEL_WIDTH}}", total=total)

        def update(done: int) -> None:
            bar.update(task, completed=done)

        yield update
