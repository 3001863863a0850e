"""The fuzz tier: the pixel kernel of an AddressSanitizer build when `make fuzz` names one, and each target's
count of examples written at the end (fuzzing.write_stats)."""
from __future__ import annotations

import importlib.util
import os
import sys

from fuzzing import write_stats

# `make fuzz` builds src/firescale/_pixels.c with -fsanitize=address into a scratch folder and names the module
# here (libasan is then LD_PRELOADed): it stands in for the installed build before any reader imports it.
ASAN_KERNEL = os.environ.get("FIRESCALE_FUZZ_ASAN_KERNEL", "")
if ASAN_KERNEL:
    if "firescale._pixels" in sys.modules and sys.modules["firescale._pixels"].__file__ != ASAN_KERNEL:
        raise RuntimeError(f"firescale._pixels was imported from {sys.modules['firescale._pixels'].__file__} "
                           f"before the fuzz tier could load {ASAN_KERNEL}")
    spec = importlib.util.spec_from_file_location("firescale._pixels", ASAN_KERNEL)
    assert spec is not None and spec.loader is not None, ASAN_KERNEL
    module = importlib.util.module_from_spec(spec)
    sys.modules["firescale._pixels"] = module
    spec.loader.exec_module(module)


def pytest_sessionfinish(session, exitstatus):
    write_stats()
