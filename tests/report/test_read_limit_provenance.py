"""A run trained under `train --read-limit-mbs` is named as such on its provenance line; a normal run is not."""
from __future__ import annotations

from firescale.report.provenance import collect_provenance, provenance_lines
from firescale.results import result_from_dict

SITE = {"name": "local", "source": "site/local/site.yaml", "sha256": "0" * 64}


def test_the_provenance_line_of_a_run_under_a_read_limit_says_so(edited, tmp_path):
    limited = edited("g2-b64-r0", train={"read_limit_mbs": 0.25})
    assert result_from_dict(limited.train.to_dict()).read_limit_mbs == 0.25
    prov = collect_provenance([edited("baseline"), limited], site=SITE, repo=tmp_path, command=["firescale", "report"])
    lines = {line.split(":")[0]: line for line in provenance_lines(prov)}
    assert ", reads limited to 0.25 MB/s per rank (--read-limit-mbs)" in lines["g2-b64-r0"]
    assert "reads limited" not in lines["baseline"]
