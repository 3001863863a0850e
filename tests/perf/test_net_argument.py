"""Every command's --net is read the same way: a built-in name or a Caffe net file that exists."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from firescale.cli import main
from firescale.commands.args import net_name
from firescale.resources import caffe_zoo_file

# Each command that names a net, with the options it needs besides the net; None marks where the net goes
# (a positional argument) or that it goes after --net.
COMMANDS = [
    ["predict", "layers", None],
    ["predict", "layers", "--net"],
    ["predict", "memory", None, "--batch", "8"],
    ["predict", "memory", "--batch", "8", "--net"],
    ["predict", "sweep", "--gpus", "1", "--batch", "8", "--bandwidth-gbits", "1", "--peak-tflops", "1",
     "--memory-gbs", "1", "--net"],
    ["predict", "calibrate", "--batch", "8", "--iteration-s", "0.02", "--net"],
    ["predict", "split", "--record", "r.json", "--site", "local", "--net"],
    ["predict", "paleo", "--net"],
    ["bench", "trainer", "--dataset", "d", "--net"],
    ["bench", "predict", "--dataset", "d", "--net"],
]


def _argv(command: list, net: str) -> list[str]:
    return [net if part is None else part for part in command] + ([net] if command[-1] == "--net" else [])


def test_every_command_refuses_an_unknown_net_or_a_missing_file_naming_both_choices(tmp_path, capsys,
                                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command in COMMANDS:
        for bad, why in (("resnet", "neither a known net nor a file"), ("nets/mine.prototxt", "no such file")):
            with pytest.raises(SystemExit) as stop:
                main(_argv(command, bad))
            err = capsys.readouterr().err
            assert stop.value.code == 2, (command, err)
            assert "expected a net: one of lenet_same, nin" in err and "cifar10_quick" in err, (command, err)
            assert f"or a Caffe net file (path/to/train_val.prototxt) that exists, not {bad!r} ({why})" in err, \
                (command, err)


def test_a_net_file_is_taken_as_its_absolute_path_and_a_name_as_given(tmp_path, monkeypatch):
    (tmp_path / "nets").mkdir()
    mine = tmp_path / "nets" / "mine.prototxt"
    mine.write_text(caffe_zoo_file("cifar10/cifar10_quick_train_test.prototxt").read_text())
    monkeypatch.chdir(tmp_path)
    assert net_name("nets/mine.prototxt") == str(mine)
    assert net_name("LeNet") == "LeNet" and net_name("cifar10-quick") == "cifar10-quick"


def test_predict_paleo_and_layers_cost_a_net_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "nets").mkdir()
    mine = tmp_path / "nets" / "mine.prototxt"
    mine.write_text(caffe_zoo_file("cifar10/cifar10_quick_train_test.prototxt").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "paleo", "--net", "nets/mine.prototxt", "--input", "32,32,3", "--json", "p.json"]) == 0
    out = capsys.readouterr().out
    assert f"from {mine}" in out and "Paleo's and FireCaffe's times are NiN's" in out
    rows = json.loads(Path("p.json").read_text())["rows"]
    assert rows[0]["speedup_vs_1gpu_256"] == 1.0 and len(rows) > 2
    # a smaller net than NiN: each row's iteration is far below NiN's on the same platform
    assert main(["predict", "paleo", "--json", "nin.json"]) == 0
    nin = json.loads(Path("nin.json").read_text())["rows"]
    assert all(r["iteration_s"] < n["iteration_s"] / 10 for r, n in zip(rows, nin))
    # Caffe's own count for CIFAR-10 quick at 32x32x3: 145,578 parameters
    assert main(["predict", "layers", "nets/mine.prototxt", "--input", "32,32,3"]) == 0
    assert "total: 145,578 parameters" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["predict", "paleo", "--net", "lenet", "--caffe-shapes"])
    assert main(["predict", "paleo", "--input", "8,8,1"]) == 1
    assert "--input and --classes describe the net of --net" in capsys.readouterr().err


def test_the_commands_that_take_the_net_first_also_take_it_as_net_and_not_both(capsys):
    """`predict layers` and `predict memory` take the net as their first argument, and as --net like the rest."""
    caffenet = str(caffe_zoo_file("bvlc_reference_caffenet/deploy.prototxt"))
    outputs = []
    for argv in (["predict", "layers", caffenet], ["predict", "layers", "--net", caffenet]):
        assert main(argv) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and "total: 60,965,224 parameters" in outputs[0]   # Caffe's own count
    assert main(["predict", "memory", "--net", "lenet", "--batch", "8"]) == 0
    assert "peak" in capsys.readouterr().out
    for argv in (["predict", "layers", "alexnet", "--net", "lenet"], ["predict", "memory", "--batch", "8"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and ("not allowed with argument net" in err
                                         or "one of the arguments net --net is required" in err), err
