"""The trainer's batches handed over by a reader thread through a queue, as NumPy arrays (any framework)."""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

_DONE = object()


class PrefetchedBatches:
    """Iterates `batches` (numpy image and label arrays) read ahead by one thread, `depth` batches deep.

    tf.data's from_generator costs several times what the reader takes (docs/performance-model.md, `bench
    trainer`); a queue of arrays costs a thread hand-off.  The order is
    the reader's, unchanged.  An error in the reader is raised by the next `next()`; `close()` stops
    the thread (a new phase of a batch schedule opens a new stream).
    """

    def __init__(self, batches: Iterator[tuple[Any, Any]], depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(batches,), name="firescale-reader", daemon=True)
        self._thread.start()

    def _read(self, batches: Iterator[tuple[Any, Any]]) -> None:
        try:
            for item in batches:
                if not self._put(item):
                    return
        except BaseException as exc:   # handed to the training thread, which raises it
            self._put(exc)
            return
        self._put(_DONE)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> PrefetchedBatches:
        return self

    def __next__(self) -> tuple[Any, Any]:
        item = self._queue.get()
        if item is _DONE:
            self._queue.put(_DONE)
            raise StopIteration
        if isinstance(item, BaseException):
            self._queue.put(item)
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
