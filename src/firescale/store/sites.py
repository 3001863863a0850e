"""Which store a site's runs go to, and what its profile says of their hardware."""
from __future__ import annotations

import sys
from typing import Any

from firescale.errors import FirescaleError
from firescale.store.database import Store, open_store, store_url


def find_site(name: str) -> Any | None:
    """The site profile `name` (site/<name>/ or $FIRESCALE_SITE_PATH), None with a warning when unknown here:
    runs from another machine's site are still stored, without its hardware."""
    from firescale.cluster.site import load_site

    try:
        return load_site(name)
    except FirescaleError as exc:
        print(f"firescale: warning: site {name!r} is not known here ({exc}); its runs are stored without the "
              f"site's hardware", file=sys.stderr)
        return None


def open_site_store(given: str | None, site_name: str | None, *, create: bool = False) -> Store:
    """The store named by --store, $FIRESCALE_RESULTS_URL or the site `site_name`'s profile, opened."""
    site = find_site(site_name) if site_name and not given else None
    return open_store(store_url(given, site), create=create)
