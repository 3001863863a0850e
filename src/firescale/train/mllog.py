"""The MLPerf-style log (RUNDIR/mllog.txt) written with the mlperf-logging package's mllog keys."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any


class RunLog:
    """An mllog.MLLogger of its own that appends `:::MLLOG {...}` lines to one file (rank 0 only).

    A resumed run appends to the same file, so the log of a run holds all its segments.
    """

    def __init__(self, path: str | Path, enabled: bool = True) -> None:
        from mlperf_logging import mllog
        from mlperf_logging.mllog import mllog as mllog_impl

        self.constants = mllog.constants
        self.enabled = enabled
        self._handler: logging.Handler | None = None
        self._logger: logging.Logger | None = None
        if not enabled:
            self._mllogger = None
            return
        logger = logging.getLogger(f"firescale.mllog.{Path(path).resolve()}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._handler = logging.FileHandler(path, mode="a", encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(self._handler)
        self._logger = logger
        self._mllogger = mllog_impl.MLLogger(logger=logger, default_stack_offset=2)

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllogger is not None:
            self._mllogger.event(key=key, value=value, metadata=metadata)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllogger is not None:
            self._mllogger.start(key=key, value=value, metadata=metadata)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllogger is not None:
            self._mllogger.end(key=key, value=value, metadata=metadata)

    def close(self) -> None:
        if self._handler is not None:
            self._handler.flush()
            self._handler.close()
            if self._logger is not None:
                self._logger.removeHandler(self._handler)
            self._handler = None
