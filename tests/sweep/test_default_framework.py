"""The experiments file's `framework` key: the backend of every experiment that names none (`make sweep` passes
`--config framework=pytorch` where the set-up has no TensorFlow); an experiment's own key wins."""
from __future__ import annotations

from pathlib import Path

import pytest

from firescale.cluster.site import load_site
from firescale.errors import FirescaleError
from firescale.sweep.config import load_config
from firescale.sweep.plan import SweepPlan

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "workflow" / "config.yaml"
EXAMPLE = REPO / "workflow" / "examples" / "fashion-lenet-pytorch.yaml"


def test_the_default_sweep_trains_with_tensorflow_unless_told():
    assert load_config(CONFIG)["experiments"]["fashion-lenet"]["framework"] == "tensorflow"   # the schema's default
    told = load_config(CONFIG, {"framework": "pytorch"})
    assert told["experiments"]["fashion-lenet"]["framework"] == "pytorch"
    assert {exp["framework"] for exp in told["experiments"].values()} == {"pytorch"}


def test_an_experiment_that_names_its_framework_keeps_it(tmp_path):
    text = CONFIG.read_text().replace("    net: lenet_same\n", "    framework: tensorflow\n    net: lenet_same\n", 1)
    mine = tmp_path / "config.yaml"
    mine.write_text(text)
    told = load_config(mine, {"framework": "pytorch"})["experiments"]
    assert told["fashion-lenet"]["framework"] == "tensorflow"
    assert told["nin-imagenet"]["framework"] == "pytorch"


def test_an_unknown_framework_is_one_sentence():
    with pytest.raises(FirescaleError, match=r"config.yaml: key 'framework': 'torch' is not allowed \(did you mean "
                                             r"'pytorch'\?\); known values: pytorch, tensorflow$"):
        load_config(CONFIG, {"framework": "torch"})


def test_the_key_is_folded_into_the_experiments_written_for_the_commands(tmp_path):
    plan = SweepPlan.build(load_config(CONFIG, {"framework": "pytorch"}), load_site("local"), base=REPO)
    anchored = plan.anchored_config()
    assert "framework" not in anchored
    assert anchored["experiments"]["fashion-lenet"]["framework"] == "pytorch"
