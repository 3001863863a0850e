"""The `--aside` option of tests/conftest.py, which `make test` uses to run two pytests side by side."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _collect(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q", f"--aside={mode}",
                           f"--junitxml={tmp_path / 'report.xml'}", "tests/slurm/test_slurm_faults.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_aside_run_writes_its_junit_report_beside_the_workers_not_over_it(tmp_path):
    aside = _collect(tmp_path, "only")
    assert aside.returncode == 0, aside.stdout + aside.stderr
    assert "1/3 tests collected (2 deselected)" in aside.stdout, aside.stdout
    assert (tmp_path / "report-aside.xml").is_file() and not (tmp_path / "report.xml").exists()
    rest = _collect(tmp_path, "exclude")
    assert "2/3 tests collected (1 deselected)" in rest.stdout, rest.stdout
    assert (tmp_path / "report.xml").is_file()
