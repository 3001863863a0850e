"""Every file a user names is read through firescale.userfile: a file of another kind, a directory, an
unreadable file or a missing one is one sentence naming the file and what was expected, never a traceback."""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli import run_firescale
from firescale.caffe.caffemodel import write_caffemodel
from firescale.caffe.net import read_net
from firescale.caffe.solver import load_solver
from firescale.cluster.site import load_site
from firescale.data.transforms import load_mean
from firescale.errors import FirescaleError
from firescale.nets.device_plan import read_layer_plan
from firescale.sweep.config import load_config

# Bytes that are not UTF-8 and hold no NUL: 0x80-0xff never begins a UTF-8 character.
NOT_UTF8 = bytes(range(0x80, 0x100)) * 4
# A file that exists and cannot be read, even by root: the kernel refuses reads of this process's memory at 0.
UNREADABLE = Path("/proc/self/mem")

# Each text reader, the file name it needs and the words its sentences use.
TEXT_READERS: dict[str, tuple[Callable[[Path], Any], str]] = {
    "net file": (read_net, "net.prototxt"),
    "solver file": (load_solver, "solver.prototxt"),
    "layer plan": (read_layer_plan, "plan.prototxt"),
    "experiments file": (load_config, "config.yaml"),
    "site profile": (load_site, "site.yaml"),
}


def _refusal(read: Callable[[Path], Any], path: Path) -> str:
    with pytest.raises(FirescaleError) as caught:
        read(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    return message


def _caffemodel(path: Path) -> Path:
    write_caffemodel(path, {"conv1": [np.ones((2, 1, 3, 3), np.float32), np.zeros(2, np.float32)]}, "lenet")
    return path


@pytest.mark.parametrize("what", TEXT_READERS)
def test_a_text_reader_refuses_binary_bytes_by_name(tmp_path: Path, what: str) -> None:
    read, name = TEXT_READERS[what]
    binary = tmp_path / name
    binary.write_bytes(_caffemodel(tmp_path / "w.caffemodel").read_bytes())
    assert re.search(rf"^{what} .* is not text \(a NUL byte at byte \d+\); expected ", _refusal(read, binary))
    binary.write_bytes(NOT_UTF8)
    assert f"{what} {binary} is not UTF-8 text (byte 0 is 0x80); expected " in _refusal(read, binary)


@pytest.mark.parametrize("what", TEXT_READERS)
def test_a_text_reader_refuses_a_directory_unreadable_or_missing_file(tmp_path: Path, what: str) -> None:
    read, name = TEXT_READERS[what]
    folder = tmp_path / name
    folder.mkdir()
    if what == "site profile":  # a site may be named by its folder: then the folder must hold site.yaml
        assert f"{folder}: no site.yaml in this folder" in _refusal(read, folder)
    else:
        assert f"{what} {folder} is a directory, not a file; expected " in _refusal(read, folder)
    unreadable = tmp_path / "unreadable" / name
    unreadable.parent.mkdir()
    unreadable.symlink_to(UNREADABLE)
    assert f"cannot read {what} {unreadable}: " in _refusal(read, unreadable)
    if what != "site profile":  # a site that is not a path is a name, looked up among the sites
        assert f"{what} {tmp_path / 'none' / name} does not exist" in _refusal(read, tmp_path / "none" / name)


def test_a_caffemodel_given_as_the_net_says_where_it_belongs(tmp_path: Path) -> None:
    weights = _caffemodel(tmp_path / "lenet.caffemodel")
    proc = run_firescale("predict", "layers", "--net", weights)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"net file {weights} is not text" in proc.stderr
    assert "a .caffemodel holds trained weights: give it with --weights" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_random_bytes_as_the_net_are_one_sentence_from_the_command(tmp_path: Path) -> None:
    noise = tmp_path / "net.prototxt"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    proc = run_firescale("predict", "layers", "--net", noise)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"net file {noise} is not " in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("suffix", [".npy", ".binaryproto"])
def test_the_mean_file_of_another_kind_is_one_sentence(tmp_path: Path, suffix: str) -> None:
    def read(path: Path) -> Any:
        return load_mean(str(path), (28, 28, 1))

    garbage = tmp_path / f"mean{suffix}"
    garbage.write_text("104 117 123\n")   # the per-channel values, written as text instead of a file's format
    kind = "a NumPy array file (.npy)" if suffix == ".npy" else "a Caffe mean image (a BlobProto)"
    assert f"mean file {garbage} is not {kind}" in _refusal(read, garbage)
    folder = tmp_path / f"folder{suffix}"
    folder.mkdir()
    assert f"mean file {folder} is a directory" in _refusal(read, folder)
    unreadable = tmp_path / f"unreadable{suffix}"
    unreadable.symlink_to(UNREADABLE)
    assert f"cannot read mean file {unreadable}: " in _refusal(read, unreadable)
    assert f"mean file {tmp_path / ('none' + suffix)} does not exist" in _refusal(read, tmp_path / f"none{suffix}")


def test_a_good_mean_file_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "mean.npy"
    np.save(path, np.full((28, 28, 1), 3.0, np.float32))
    assert float(load_mean(str(path), (28, 28, 1)).mean()) == 3.0


def test_the_readers_run_as_root_here_so_unreadable_is_real() -> None:
    """The unreadable cases above rely on a read failing for root too; check the premise."""
    with pytest.raises(OSError):
        UNREADABLE.read_bytes()
    assert os.path.exists(UNREADABLE)


def test_weights_and_records_go_through_the_same_reader(tmp_path: Path) -> None:
    from firescale.atomic import load_json
    from firescale.caffe.caffemodel import read_caffemodel

    folder = tmp_path / "w.caffemodel"
    folder.mkdir()
    assert f"NetParameter (.caffemodel) {folder} is a directory, not a file" in _refusal(read_caffemodel, folder)
    record = tmp_path / "result.json"
    record.write_bytes(NOT_UTF8)
    assert f"result {record} is not UTF-8 text (byte 0 is 0x80)" in _refusal(lambda p: load_json(p, "result"), record)
