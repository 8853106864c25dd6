"""Progress bars on stderr for long runs (quiet when not a terminal or when disabled)."""

from __future__ import annotations

import sys
from typing import Callable


def progress_callback(total: int, desc: str, *, enabled: bool = True,
                      min_total: int = 2000) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """Return (tick(i), close()) for a bar over ``total`` items; (None, noop) when off."""
    if not enabled or total < min_total or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="req", file=sys.stderr, leave=False,
               mininterval=0.5)
    step = max(1, total // 200)

    def tick(i: int) -> None:
        if i % step == 0:
            bar.update(step)

    return tick, bar.close
