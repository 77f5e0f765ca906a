"""Reading a stream's pages ahead of its fold: a reader thread runs the next XRANGEs while
the caller decodes and folds the page it has (replay reads a million entries a page at a
time; each XRANGE's round trip and the server's work for it overlap the caller's).

Only for a real Redis (``RedisBackend``): the simulation's in-memory backend is read where
the caller asks, so its runs stay deterministic. The pages, their order and the errors are
the same as reading them in the caller: an error of the reader is raised by the caller
after every page read before it, and a caller that stops early (an exception, a generator
closed) stops the reader.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["read_ahead", "AHEAD"]

AHEAD = 2
"""Pages read ahead of the caller (each up to ``page`` entries: 2 pages of 2,000 are a few MB)."""

_END = object()


def read_ahead(
    xrange: Callable[[str, str | None, int], list[Any]], stream: str, after: str, page: int, *, ahead: int = AHEAD
) -> Iterator[list[Any]]:
    """The stream's raw entries after ``after``, one XRANGE of up to ``page`` at a time, as
    ``EventLog._batches`` gives them, fetched by a thread up to ``ahead`` pages early."""
    pages: queue.Queue[Any] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                pages.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        start: str | None = after
        try:
            while not stop.is_set():
                batch = xrange(stream, start, page)
                if batch and not put(batch):
                    return
                if len(batch) < page:
                    break
                start = batch[-1][0]
        except BaseException as exc:  # given to the caller, after the pages before it
            put(exc)
            return
        put(_END)

    reader = threading.Thread(target=read, name=f"read-ahead {stream}", daemon=True)
    reader.start()
    try:
        while True:
            item = pages.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join()
