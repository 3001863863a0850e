"""What the host reads back from the iterations, every few of them: the summed losses and stop flags."""
from __future__ import annotations

import collections
import signal
from collections.abc import Callable
from typing import Any

import numpy as np

from firescale.errors import FirescaleError

# TERM, and the walltime signals the job forwards: USR1, or USR2 where NCCL runs (it may take USR1 for itself)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
READ_EVERY = 10    # iterations between the host's reads of the summed losses and stop flags (at most)


class StopRequest:
    """Remembers a SIGTERM, SIGUSR1 or SIGUSR2; the ranks agree on it where the host next reads the summed flags."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self.signum = signum


def read_due(iteration: int, intervals: tuple[int, ...], last: int) -> bool:
    """Whether the host reads after `iteration` (1-based count of updates done): every READ_EVERY, at every
    multiple of the loop's other `intervals` (display, snapshot, test; 0 for none) and at the `last`."""
    if iteration >= last or iteration % READ_EVERY == 0:
        return True
    for every in intervals:   # a plain loop: this runs every iteration
        if every and iteration % every == 0:
            return True
    return False


class LossReads:
    """The iterations' summed (loss, stop flag) pairs, kept on the device until the host reads them all at
    once; the training loss averaged over the last `average_loss` iterations read (Caffe's display)."""

    def __init__(self, average_loss: int, host: Callable[[Any], np.ndarray] = np.asarray) -> None:
        self.host = host   # reads a device value back (the backend's Steps.host)
        self.losses: collections.deque[float] = collections.deque(maxlen=average_loss)
        self.unread: list[tuple[Any, int]] = []   # each iteration's summed pair, and the images it summed over

    def add(self, loss_and_flag: Any, images: int) -> None:
        self.unread.append((loss_and_flag, images))

    def read(self, iteration: int) -> bool:
        """Read the pairs up to `iteration` to the host; a loss that diverged is an error naming its
        iteration.  True when a rank's stop flag was up (a rank's flag stays up once raised, so the
        last pair shows every earlier one)."""
        first = iteration - len(self.unread)
        values = [(self.host(pair), images) for pair, images in self.unread]
        self.unread.clear()
        for k, (pair, images) in enumerate(values):
            self.losses.append(float(pair[0]) / images)
            if not np.isfinite(self.losses[-1]):
                raise FirescaleError(f"the training loss became {self.losses[-1]} at iteration {first + k + 1}; "
                                     "lower base_lr (solver key 'base_lr')")
        return bool(values and values[-1][0][1] > 0)

    @property
    def average(self) -> float:
        return float(np.mean(self.losses))
