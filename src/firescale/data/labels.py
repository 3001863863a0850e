"""The labels a reader hands out: whole numbers from 0, within the dataset's classes, or one sentence."""
from __future__ import annotations

import numpy as np

from firescale.errors import FirescaleError

MAX_LABEL = (1 << 20) - 1  # far above any classification dataset's classes, far below a damaged label's


def check_labels(labels: np.ndarray, where: str, num_classes: int | None = None) -> np.ndarray:
    """`labels` as int64 when each is a whole number in 0..num_classes-1 (0..MAX_LABEL without a count);
    otherwise an error naming the first record (its index in `where`) that is not."""
    top = MAX_LABEL if num_classes is None else num_classes - 1
    values = np.asarray(labels)
    if values.dtype.kind not in "biuf":
        raise FirescaleError(f"{where} holds labels of type {values.dtype}; labels are whole numbers")
    with np.errstate(invalid="ignore"):
        bad = (values < 0) | (values > top)
        if values.dtype.kind == "f":
            bad |= ~np.isfinite(values) | (values != np.round(values))
    if bad.any():
        j = int(np.argmax(bad))
        raise FirescaleError(f"{where} record {j} has label {values[j]}; allowed are whole numbers 0..{top}")
    return values.astype(np.int64)
