"""`firescale results table`: one paper-style table of an experiment across sites, beside published rows."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from firescale.commands.results_add import STORE_HELP

if TYPE_CHECKING:
    from firescale.store.database import Store
    from firescale.store.reference import ReferenceRow

ALL = "all"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", required=True,
                        help="an experiment's name, or 'all': a table of every experiment of the config with runs "
                             "on more than one site, and an index.md of them")
    parser.add_argument("--sites", help="comma-separated sites, in the table's order (default: the sites the "
                                        "experiment lists in the config, then every other site holding runs)")
    parser.add_argument("--reference", action="append", default=[], metavar="FILE",
                        help="published rows to show beside the measured ones: a reference file (CSV) or a shipped "
                             "name (firecaffe-table2, firecaffe-table3); repeatable")
    parser.add_argument("--baseline-site", metavar="SITE",
                        help="take every measured row's speedup and parity against this site's baseline "
                             "(default: each site's own)")
    parser.add_argument("--select", metavar="KEY=VALUE,...", action="append", default=[],
                        help="narrow the runs read (commit=, tag=, framework=, precision=, since=, until=, sweep=); "
                             "each site's newest sweep among them is shown; one that names a site (site=S,...) "
                             "narrows that site's runs alone; repeatable")
    parser.add_argument("--store", help=STORE_HELP + "; without one, the store of each site")
    parser.add_argument("--config", help="experiments file (default: ./workflow/config.yaml)")
    parser.add_argument("--out", required=True, type=Path,
                        help="folder to write <experiment>/table.{md,tex,html,csv} into")


def _config(given: str | None, optional: bool) -> dict[str, Any] | None:
    """The experiments file; None where it is `optional` (one experiment from a named store: it only orders
    the sites) and none is given or in ./workflow/."""
    from firescale.sweep.config import load_config
    from firescale.sweep.paths import CONFIG_FILE, config_file

    if optional and not given and not CONFIG_FILE.is_file():
        return None
    return load_config(config_file(given))


def _listed_sites(config: dict[str, Any] | None, experiment: str) -> list[str]:
    exp = (config or {}).get("experiments", {}).get(experiment)
    return list(exp["sites"]) if exp else []


def _site_url(name: str, required: bool) -> str | None:
    """The store of site `name` ($FIRESCALE_RESULTS_URL where set); None for a site not known here, unless
    `required` (named in --sites), which refuses it."""
    from firescale.cluster.site import load_site
    from firescale.errors import FirescaleError
    from firescale.store.database import store_url

    try:
        return store_url(None, load_site(name))
    except FirescaleError as exc:
        if required:
            raise FirescaleError(f"site {name!r}: {exc}; give --store URL to read its runs from a store") from None
        print(f"firescale: warning: site {name!r} is not known here ({exc}); its store is not read", file=sys.stderr)
        return None


def store_urls(given: str | None, sites: list[str], required: bool) -> tuple[list[str], bool]:
    """The stores to read, each once, and whether they were named (--store or $FIRESCALE_RESULTS_URL) rather
    than found from the sites."""
    import os

    from firescale.store.database import URL_VARIABLE, store_url

    if given or os.environ.get(URL_VARIABLE):
        return [store_url(given)], True
    urls = [_site_url(name, required) for name in sites]
    return list(dict.fromkeys(u for u in urls if u)), False


def _open(url: str, named: bool) -> Store | None:
    """The store at `url`; a site's SQLite store that was never made holds no runs (None), a named one refuses."""
    from sqlalchemy.engine import make_url

    from firescale.store.database import open_store

    parsed = make_url(url)
    if not named and parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        return None
    return open_store(url, create=False)


def _references(values: list[str]) -> list[ReferenceRow]:
    from firescale.store.reference import read_reference, reference_path

    return [row for value in values for row in read_reference(reference_path(value))]


def _write(table: Any, out: Path) -> Path:
    from firescale.store.table_writers import write_table

    written = write_table(table, out / table.experiment)
    measured = sum(r.kind != "published" for r in table.rows)
    print(f"{written[-1]}: {table.experiment} on {', '.join(table.sites)} ({measured} measured rows, "
          f"{len(table.rows) - measured} published)")
    return written[-1]


def _index(out: Path, tables: list[Any], experiments: list[str], where: str) -> Path:
    from firescale.atomic import atomic_write_text

    lines = ["# Tables across sites", ""]
    if tables:
        lines += ["| Experiment | Sites | Rows | Table |", "|---|---|---:|---|"]
        lines += [f"| {t.experiment} | {', '.join(t.sites)} | {len(t.rows)} | [{t.experiment}/table.md]"
                  f"({t.experiment}/table.md) ([HTML]({t.experiment}/table.html), [LaTeX]({t.experiment}/table.tex), "
                  f"[CSV]({t.experiment}/table.csv)) |" for t in tables]
    else:
        lines += [f"No experiment has runs on more than one site yet (experiments: {', '.join(experiments)}; "
                  f"stores read: {where})."]
    path = atomic_write_text(out / "index.md", "\n".join(lines + [""]))
    print(f"{path}: {len(tables)} table{'s' if len(tables) != 1 else ''}")
    return path


def _where(opened: list[Store], urls: list[str]) -> str:
    """The stores read, as messages name them."""
    if opened:
        return ", ".join(s.name for s in opened)
    if urls:
        return f"the sites' stores, none of them made yet ({', '.join(urls)})"
    return "no store (the experiments file lists no site for it; name --sites or --store)"


def _selections(given: list[str]) -> tuple[Any, dict[str, Any]]:
    """The --select that narrows every site's runs, and those that narrow one site's each."""
    from firescale.errors import FirescaleError
    from firescale.store.select import Selection

    parsed = [Selection.parse(text, f"--select {text}") for text in given]
    per_site = {str(s.value("site")): s for s in parsed if s.value("site")}
    general = [s for s in parsed if not s.value("site")]
    if len(general) > 1 or len(per_site) < len([s for s in parsed if s.value("site")]):
        raise FirescaleError("--select: give at most one selection without site= and one for each site; join a "
                             "selection's pairs with commas (framework=pytorch,precision=bf16)")
    return (general[0] if general else None), per_site


def _tables(args: argparse.Namespace, opened: list[Store], where: str, sites: dict[str, list[str]],
            named: list[str]) -> list[Any]:
    """The table of each experiment; with 'all', only of those with runs on more than one site."""
    from firescale.store.table import build_table, read_runs

    narrow, per_site = _selections(args.select)
    references = _references(args.reference)
    every, tables = args.experiment == ALL, []
    for experiment, listed in sites.items():
        runs = [r for r in read_runs(opened, experiment, narrow) if r.site not in per_site]
        for selection in per_site.values():
            runs += read_runs(opened, experiment, selection)
        if every:
            runs = [r for r in runs if not named or r.site in named]
            if len({r.site for r in runs}) < 2:
                continue
        tables.append(build_table(experiment, runs, where=where, sites=listed, explicit=bool(named) and not every,
                                  baseline_site=args.baseline_site, references=references))
    return tables


def run(args: argparse.Namespace) -> int:
    named = [s.strip() for s in (args.sites or "").split(",") if s.strip()]
    every = args.experiment == ALL
    import os

    from firescale.store.database import URL_VARIABLE

    named_store = bool(args.store or os.environ.get(URL_VARIABLE))
    config = _config(args.config, optional=named_store and not every) if every or not named else None
    experiments = list(config["experiments"]) if every and config else [args.experiment]
    sites = {e: named or _listed_sites(config, e) for e in experiments}
    read = [s for e in experiments for s in sites[e]] + ([args.baseline_site] if args.baseline_site else [])
    urls, given = store_urls(args.store, list(dict.fromkeys(read)), bool(named))
    stores = {url: _open(url, given) for url in urls}
    try:
        opened = [s for s in stores.values() if s is not None]
        where = _where(opened, urls)
        tables = _tables(args, opened, where, sites, named)
    finally:
        for store in stores.values():
            if store is not None:
                store.close()
    for table in tables:
        _write(table, args.out)
    if every:
        _index(args.out, tables, experiments, where)
    return 0
