"""`firescale results list`: the sweeps a results store holds, one line each (its key selects it: sweep=...)."""
from __future__ import annotations

import argparse

from firescale.commands.results_add import STORE_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help=STORE_HELP)
    parser.add_argument("--site", help="only this site's sweeps (and, without --store, that site's store)")
    parser.add_argument("--experiment", help="only this experiment's sweeps")
    parser.add_argument("--since", help="only sweeps with runs finished on or after this date (2026-12-01)")


def run(args: argparse.Namespace) -> int:
    from firescale.errors import FirescaleError
    from firescale.store.select import Selection, select_runs
    from firescale.store.sites import open_site_store
    from firescale.store.sweeps import stored_sweeps

    pairs = [f"{k}={v}" for k, v in (("site", args.site), ("experiment", args.experiment), ("since", args.since)) if v]
    selection = Selection.parse(",".join(pairs), "results list")
    store = open_site_store(args.store, args.site)
    try:
        found = select_runs(store, selection)
    finally:
        store.close()
    if not found:
        raise FirescaleError(f"{store.name}: no runs match {selection.text or 'the store'}")
    print(f"{'sweep':<12} {'site':<14} {'experiment':<22} {'commit':<12} {'framework':<10} {'precision':<9} "
          f"{'finished':<20} {'points':>6}  best speedup at parity")
    for sweep in stored_sweeps(found):
        first, best = sweep.first, sweep.best_speedup_at_parity
        commit = first.commit[:10] + ("+" if first.dirty else "")
        shown = f"{best[0]:.2f}x ({best[1]})" if best else "none at parity"
        # a sweep whose runs trained with several backends or precisions says so: "pytorch+tensorflow"
        framework, precision = ("+".join(sorted({getattr(r, key) for r in sweep.runs})) for key in ("framework",
                                                                                                   "precision"))
        print(f"{sweep.key[:12]:<12} {first.site:<14} {first.experiment:<22} {commit:<12} {framework:<10} "
              f"{precision:<9} {sweep.finished_at:<20} {sweep.points:>6}  {shown}")
    return 0
