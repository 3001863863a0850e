"""How `bench predict` and the probes start ranks as a site does: what a failed run reports."""
from __future__ import annotations

import sys

import pytest

from firescale.cluster.site import load_site
from firescale.errors import FirescaleError


def test_a_failed_rank_is_quoted_by_its_own_error_not_the_launchers_notice():
    # mpirun closes a failed run with a framed notice ("the job to be terminated. The first process to do so
    # was: ..."); quoting its last lines hid the rank's traceback (seen when a training run of `bench predict`
    # failed).  The rank's own last lines are quoted.
    from firescale.cluster.ranks import site_ranks
    ranks = site_ranks(load_site("local"))
    script = "import sys; print('ValueError: no such solver key: momentum3', file=sys.stderr); sys.exit(1)"
    with pytest.raises(FirescaleError) as caught:
        ranks.run(1, [sys.executable, "-c", script], "the check")
    message = str(caught.value)
    assert "the check (1 ranks on site local) failed with exit code 1" in message
    assert "ValueError: no such solver key: momentum3" in message
    assert "Process name" not in message and "-----" not in message
