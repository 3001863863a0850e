"""`make fuzz`: the fuzz tier in rounds for a number of minutes, on one core, the pixel kernel built with
AddressSanitizer, and what it tried per target.

    python tests/fuzz/campaign.py --minutes 30 --scale 10 --out .venv/fuzz [--asan-kernel PATH]

Each round is one pytest of tests/fuzz (FIRESCALE_FUZZ=long: every target's make-test examples times --scale)
with a seed of its own, so that no two rounds draw the same inputs; failing examples are kept in OUT/examples
and replayed first by the next run.  The rounds run one after the other on one core (the campaign pins itself
and its pytest, whose forked readers inherit the pin).  A round that fails ends the campaign: its output is
OUT/round-N.log.  At the end, OUT/stats.json and the table printed hold each target's examples and seconds.
With --asan-kernel (a build of src/firescale/_pixels.c with -fsanitize=address), each pytest loads that build
in place of the installed one, with libasan preloaded (LD_PRELOAD) since Python itself is not built with it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def libasan() -> str:
    """The path of the compiler's libasan.so (gcc -print-file-name), for LD_PRELOAD."""
    cc = os.environ.get("CC", "gcc")
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=True).stdout
    if not os.path.isabs(path.strip()):
        sys.exit(f"fuzz: {cc} has no libasan.so (install gcc's AddressSanitizer runtime, libasan8 on Debian 12)")
    return path.strip()


def round_env(args: argparse.Namespace, stats: Path) -> dict[str, str]:
    env = {**os.environ, "FIRESCALE_FUZZ": "long", "FIRESCALE_FUZZ_SCALE": str(args.scale),
           "FIRESCALE_FUZZ_STATS": str(stats), "FIRESCALE_FUZZ_DB": str(args.out / "examples"),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)}
    if args.asan_kernel:
        env |= {"FIRESCALE_FUZZ_ASAN_KERNEL": str(Path(args.asan_kernel).resolve()), "LD_PRELOAD": libasan(),
                # Python's own allocations are never freed at exit: leak reports would be noise.  A damaged size
                # asking for terabytes gets NULL (numpy's MemoryError), not ASan's abort.
                # A reader's memory past hard_rss_limit_mb ends it (the forked readers' address-space cap cannot
                # work beside ASan's shadow memory), so that a count a damage makes huge cannot take the machine's.
                "ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1:abort_on_error=0:exitcode=86:"
                                "hard_rss_limit_mb=4096",
                # every Python object from malloc, so that ASan sees the bounds of a bytes object too
                "PYTHONMALLOC": "malloc"}
    return env


def _capped() -> None:
    """Without ASan: the round's pytest (and its forked readers) in 8 GiB of address space."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to fuzz, in all (default 30)")
    parser.add_argument("--scale", type=int, default=10, help="each round's examples per target, as a multiple of "
                                                              "make test's (default 10)")
    parser.add_argument("--out", type=Path, default=REPO / ".venv" / "fuzz", help="logs, stats, failing examples")
    parser.add_argument("--asan-kernel", help="the pixel kernel built with -fsanitize=address")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="the first round's seed")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --), e.g. -k pixels")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if hasattr(os, "sched_setaffinity"):   # one core for the campaign, its pytest and their readers
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    stats = args.out / "stats.json"
    stats.unlink(missing_ok=True)
    env = round_env(args, stats)
    end = time.monotonic() + 60 * args.minutes
    rounds, code = 0, 0
    while time.monotonic() < end:
        seed = args.seed + rounds
        log = args.out / f"round-{rounds}.log"
        argv = [sys.executable, "-m", "pytest", str(REPO / "tests" / "fuzz"), "-p", "no:cacheprovider", "-q",
                f"--hypothesis-seed={seed}", "--hypothesis-show-statistics", *args.pytest_args]
        started = time.monotonic()
        with open(log, "w") as out:
            code = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                  preexec_fn=None if args.asan_kernel else _capped).returncode
        print(f"fuzz: round {rounds} (seed {seed}) {'passed' if code == 0 else f'FAILED ({code})'} in "
              f"{time.monotonic() - started:.0f} s; {log}", flush=True)
        rounds += 1
        if code != 0:
            break
    table(stats, rounds)
    return code


def table(stats: Path, rounds: int) -> None:
    found = json.loads(stats.read_text()) if stats.is_file() else {}
    print(f"\n| target | examples | seconds |  ({rounds} round(s))\n|---|---:|---:|")
    for target, (n, seconds) in sorted(found.items()):
        print(f"| {target} | {n} | {seconds:.1f} |")
    print(f"| all | {sum(v[0] for v in found.values())} | {sum(v[1] for v in found.values()):.1f} |")


if __name__ == "__main__":
    sys.exit(main())
