"""`firescale results add`: put finished runs (a point's folder, a sweep's runs/) into a results store."""
from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path

STORE_HELP = ("a results store: a URL (sqlite:////path/store.sqlite, postgresql://user@host/db) or a SQLite file's "
              "path (default: $FIRESCALE_RESULTS_URL, else the site's store, docs/store.md)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="a point's run folder (results/<site>/<experiment>/runs/<point>), a sweep's runs/ "
                             "folder, or results/<site>/<experiment>")
    parser.add_argument("--store", help=STORE_HELP)
    parser.add_argument("--tag", help="a label to attach to every run added (select it with tag=...)")


def run(args: argparse.Namespace) -> int:
    from firescale.source import git_state
    from firescale.store.add import add_runs, runs_in_folder
    from firescale.store.database import open_store, store_url
    from firescale.store.runs import RunContext, StoredRun
    from firescale.store.sites import find_site

    site_of = cache(find_site)
    by_store: dict[str, list[StoredRun]] = {}
    for folder in args.run_dirs:
        git = git_state(folder.resolve())     # records from before runs kept their commit take the checkout's
        for found in runs_in_folder(folder, RunContext(commit=git["commit"], dirty=git["dirty"]), site_of):
            url = store_url(args.store, None if args.store else site_of(found.site))
            by_store.setdefault(url, []).append(found)
    for url, found_runs in by_store.items():
        store = open_store(url, create=True)
        try:
            report = add_runs(store, found_runs, tag=args.tag, source=", ".join(str(p) for p in args.run_dirs))
        finally:
            store.close()
        tagged = f", tag {args.tag!r} attached to {report.tagged}" if args.tag else ""
        sweeps = len(report.sweeps)
        print(f"{store.name}: {report.added} runs added, {report.already} already there{tagged} "
              f"({sweeps} sweep{'s' if sweeps != 1 else ''})")
    return 0
