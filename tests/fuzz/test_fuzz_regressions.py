"""What the fuzz tier found, each kept as the input that found it: before its fix, each escaped its reader as
another exception than a FirescaleError (or a sentence that did not name the file); now each is one sentence."""
from __future__ import annotations

import pytest
import yaml
from fuzzing import one_sentence, scratch_file

from firescale.errors import FirescaleError

pytestmark = pytest.mark.fuzz


def refused(read, path, match: str) -> str:
    with pytest.raises(FirescaleError, match=match) as caught:
        read()
    one_sentence(caught.value, path)
    return str(caught.value)


# ---------------------------------------------------------------- layer plans

@pytest.mark.parametrize("item", [[], None, "conv1", 3])
def test_a_yaml_layer_plans_arch_item_that_is_not_a_mapping(item):
    """dict() of a YAML arch's item raised ValueError or TypeError."""
    from firescale.nets.device_plan import read_layer_plan

    plan = {"dist": {"train": [[item, {"name": "conv2", "device": 1}]]}}
    path = scratch_file("plan.yaml", yaml.safe_dump(plan), "regressions")
    refused(lambda: read_layer_plan(path), path, r"dist.train\[0\]: item 0 is .*; each item of an arch is a mapping")


# ---------------------------------------------------------------- YAML

def test_a_control_character_in_a_yaml_file_is_one_line():
    """PyYAML's ReaderError ran over two lines ('in "<unicode string>", position 0')."""
    from firescale.yamlfile import load_yaml

    path = scratch_file("config.yaml", "site: local\n\x1fexperiments: {}\n", "regressions")
    assert "line 2 holds character 0x1f" in refused(lambda: load_yaml(path), path, "which YAML does not allow")


# ---------------------------------------------------------------- HDF5 weights and solver states

def _h5_with_a_damaged_group(write, *args) -> bytes:
    """A file as `write` writes it, with the signature of its first symbol-table node (a group's) broken."""
    path = scratch_file("base.h5", b"", "regressions")
    write(path, *args)
    raw = bytearray(path.read_bytes())
    at = raw.rfind(b"SNOD")
    assert at > 0
    raw[at:at + 4] = b"SNOE"
    return bytes(raw)


def test_a_caffemodel_h5_whose_group_is_damaged():
    """h5py's RuntimeError ('bad symbol table node signature') escaped read_caffemodel_h5, which caught OSError."""
    import numpy as np

    from firescale.caffe.caffemodel import read_weights, write_caffemodel_h5

    raw = _h5_with_a_damaged_group(write_caffemodel_h5, {"conv1": [np.ones((2, 1, 3, 3), np.float32)]})
    path = scratch_file("lenet.caffemodel.h5", raw, "regressions")
    refused(lambda: read_weights(path), path, r"\(Caffe's HDF5 weights\) cannot be read: HDF5 reports .*damaged")


def test_a_solverstate_h5_whose_group_is_damaged():
    import numpy as np

    from firescale.caffe.solverstate import CaffeSolverState, read_solverstate, write_solverstate_h5

    state = CaffeSolverState(7, "x.caffemodel.h5", [np.ones(3, np.float32), np.ones(2, np.float32)])
    path = scratch_file("x.solverstate.h5", _h5_with_a_damaged_group(write_solverstate_h5, state), "regressions")
    refused(lambda: read_solverstate(path), path, r"cannot be read: HDF5 reports")


def test_a_solverstate_h5_of_other_kinds_of_values():
    """An empty `iter` raised IndexError, a text one ValueError, a history dataset in place of its group
    ValueError, a history blob of text reached the trainer as a string array."""
    import h5py
    import numpy as np

    from firescale.caffe.solverstate import read_solverstate

    def state(blob=None, **replace) -> object:
        path = scratch_file("odd.solverstate.h5", b"", "regressions")
        with h5py.File(path, "w") as fh:
            values = {"iter": np.array([3], np.int32), "current_step": np.array([0], np.int32)} | replace
            for key, value in values.items():
                if value is not None:
                    fh.create_dataset(key, data=value)
            if "history" not in replace:
                fh.create_group("history").create_dataset("0", data=np.ones(2, np.float32) if blob is None else blob)
        return path

    for replace, match in (({"iter": np.zeros(0, np.int32)}, "'iter' holds int32 of shape"),
                           ({"iter": np.array([b"3"])}, "'iter' holds"),
                           ({"history": np.ones(3)}, "'history' is not a group"),
                           ({"history": None}, "has no 'history'"),
                           ({}, r"history/0 holds \|S4 values")):
        path = state(np.array([b"text"]), **replace) if not replace else state(**replace)
        refused(lambda p=path: read_solverstate(p), path, match)


# ---------------------------------------------------------------- mean files

def _npy(array) -> bytearray:
    import io

    import numpy as np

    out = io.BytesIO()
    np.save(out, array)
    return bytearray(out.getvalue())


@pytest.mark.parametrize("at, byte", [(20, ord("[")), (10, ord("("))])
def test_a_mean_npy_whose_header_is_damaged(at, byte):
    """numpy's header parser raised SyntaxError or tokenize's TokenError, which the reader did not catch."""
    import numpy as np

    from firescale.data.transforms import load_mean

    raw = _npy(np.zeros((4, 4, 3), np.float32))
    raw[at] = byte
    path = scratch_file("mean.npy", bytes(raw), "regressions")
    refused(lambda: load_mean(str(path), (4, 4, 3)), path, "is not a NumPy array file")


def test_a_mean_npy_that_claims_more_values_than_it_holds():
    """The header's shape is read first: no allocation of the size a damaged header claims."""
    import numpy as np

    from firescale.data.transforms import load_mean

    raw = _npy(np.zeros((4, 4, 3), np.float32))
    header = bytes(raw).replace(b"'shape': (4, 4, 3)", b"'shape': (4000000000, 4000, 3)")
    path = scratch_file("mean.npy", header, "regressions")
    refused(lambda: load_mean(str(path), (4, 4, 3)), path, "its header says")


def test_a_mean_binaryproto_whose_packed_values_are_cut():
    """np.frombuffer's ValueError (a packed float field of 5 bytes) escaped the BlobProto reader."""
    from firescale.caffe.wire import VARINT, encode_varint, length_delimited, tag
    from firescale.data.transforms import load_mean

    raw = tag(2, VARINT) + encode_varint(1) + length_delimited(5, b"\0" * 5)
    path = scratch_file("mean.binaryproto", raw, "regressions")
    refused(lambda: load_mean(str(path), (1, 1, 1)), path, "not a whole number of floats")


# ---------------------------------------------------------------- manifests

@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from firescale.data.ingest import ingest
    from firescale.data.sources import load_source

    source = load_source("digits", test_fraction=0.2, seed=0, resize=None)
    return ingest(source, tmp_path_factory.mktemp("digits"), "digits", ["lmdb", "hdf5"], options={}).path


def _with_manifest(digits, tmp_path, change):
    import json
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(digits, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    change(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("change, match", [
    (lambda m: m.pop("classes"), "key 'classes' is missing or not a list of class names"),
    (lambda m: m.update(shape=[8, 8]), "key 'shape' is missing or not"),
    (lambda m: m["splits"]["train"].update(records="1437"), "key 'splits.train.records' is missing or not"),
    (lambda m: m["splits"]["train"]["files"].pop("train.h5"), r"key 'splits.train.files.train.h5' is missing"),
    (lambda m: m.update(splits=[]), "key 'splits' is missing or not a mapping of train and test"),
])
def test_a_manifest_missing_a_key_the_readers_use(digits, tmp_path, change, match):
    """open_dataset and verify read manifest["classes"], ["shape"], ... as they are: a KeyError or a TypeError."""
    from firescale.data.manifest import verify_dataset
    from firescale.data.readers import open_dataset

    copy = _with_manifest(digits, tmp_path, change)
    refused(lambda: open_dataset(copy, "train", "hdf5"), copy / "manifest.json", match)
    refused(lambda: verify_dataset(copy), copy / "manifest.json", match)


def test_a_manifest_counting_two_billion_records(digits, tmp_path):
    """The LMDB reader made one key per record the manifest counted before looking at the tree: minutes and
    gigabytes for a count a damaged digit makes 2**31."""
    from firescale.data.readers import open_dataset

    copy = _with_manifest(digits, tmp_path, lambda m: m["splits"]["train"].update(records=2**31))
    mdb = copy / "train.lmdb" / "data.mdb"
    refused(lambda: open_dataset(copy, "train", "lmdb"), mdb, r"holds 1438 records, the manifest says 2147483648")


def test_a_manifest_whose_shape_is_not_the_hdf5_files(digits, tmp_path):
    """The HDF5 split was opened with the manifest's shape unchecked: batches of another shape than its records."""
    from firescale.data.readers import open_dataset

    copy = _with_manifest(digits, tmp_path, lambda m: m.update(shape=[8, 4, 2]))
    refused(lambda: open_dataset(copy, "train", "hdf5"), copy / "train.h5", r"records of \(8, 8, 1\), the manifest "
                                                                            r"says 1438 of \(8, 4, 2\)")


# ---------------------------------------------------------------- net files

@pytest.mark.parametrize("value", ['"null"', "{ }", "true"])
def test_a_v1_layers_blobs_lr_that_is_not_a_number(repo, value):
    """float() of a V1 layer's blobs_lr raised ValueError or TypeError."""
    from firescale.caffe.net import read_net

    written = f"blobs_lr {value}" if value.startswith("{") else f"blobs_lr: {value}"
    text = (repo / "tests/caffe/net_files/lenet_v1.prototxt").read_text().replace("blobs_lr: 1", written, 1)
    path = scratch_file("lenet_v1.prototxt", text, "regressions")
    refused(lambda: read_net(path), path, r"layer 'conv1'.*'blobs_lr' is .*; expected a number per blob")


# ---------------------------------------------------------------- Caffe's HDF5Data list

@pytest.mark.parametrize("line", ["caffe_train_0.h5caffe_train_1.h5", "/dev/null", "."])
def test_a_caffe_hdf5_list_naming_what_is_not_an_hdf5_file(tmp_path, line):
    """A missing file was h5py's OSError in a sentence naming only the missing file, not the list."""
    from firescale.data.readers import open_dataset

    listing = tmp_path / "train_caffe_hdf5.txt"
    listing.write_text(line + "\n")
    refused(lambda: open_dataset(listing, "train"), listing, r"\(listed in .*train_caffe_hdf5.txt\) is not a file")


# ---------------------------------------------------------------- experiments files

def test_an_experiments_file_asking_for_four_billion_repeats(repo):
    """`repeats: 4294967296` (a digit or two too many) planned that many runs of every point: the planner ran
    until memory ran out.  The schema now allows 1 to 100."""
    from firescale.sweep.config import load_config

    text = (repo / "tests/report/data/config.yaml").read_text().replace("repeats: 2", "repeats: 4294967296")
    path = scratch_file("config.yaml", text, "regressions")
    refused(lambda: load_config(path, {"site": "local"}), path, r"repeats': 4294967296 is greater than the maximum "
                                                                 "of 100")


# ---------------------------------------------------------------- binary solver states

def test_a_solverstate_whose_learned_net_is_not_utf8():
    """protobuf hands a string field that is not UTF-8 over as bytes: the state's learned_net reached the
    resume as bytes, where a path is expected."""
    from firescale.caffe.solverstate import read_solverstate
    from firescale.caffe.wire import VARINT, encode_varint, length_delimited, tag

    raw = tag(1, VARINT) + encode_varint(10000) + length_delimited(2, b"\x00\x00\x00\x00\x80lenet.caffemodel")
    path = scratch_file("lenet.solverstate", raw, "regressions")
    refused(lambda: read_solverstate(path), path, "learned_net is not UTF-8 text")


# ---------------------------------------------------------------- solvers' learning-rate schedules

@pytest.mark.parametrize("keys, match", [
    ({"lr_policy": "inv", "gamma": -1, "power": 0.75}, r"'gamma' is -1.0, which makes 1 \+ gamma \* iter reach -598"),
    ({"lr_policy": "inv", "gamma": -9223372036854775809, "power": 0.75}, "which makes 1 \\+ gamma \\* iter reach"),
    ({"lr_policy": "exp", "gamma": 10}, r"'gamma' is 10.0, which raised to the power 599 makes the rate overflow"),
    ({"lr_policy": "exp", "gamma": -0.5}, "'gamma' must not be negative with lr_policy 'exp'"),
    ({"lr_policy": "poly", "power": -200}, "'power' is -200.0, which makes the rate overflow by iteration 599"),
])
def test_a_solver_whose_rate_leaves_the_real_numbers(repo, keys, match):
    """lr_policy inv with gamma -1 (a digit changed in workflow/solvers/lenet-digits-b8.yaml) raised
    ZeroDivisionError at the second iteration; gamma -9223372036854775809 gave complex rates; an exp or poly
    schedule overflowed.  Each was accepted by the checks and met by the trainer mid-run."""
    from firescale.caffe.solver import load_solver

    text = (repo / "workflow/solvers/lenet-digits-b8.yaml").read_text().replace("lr_policy: inv\n", "")
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("gamma:", "power:")))
    text += "\n" + "".join(f"{k}: {v}\n" for k, v in keys.items())
    path = scratch_file("lenet-digits-b8.yaml", text, "regressions")
    refused(lambda: load_solver(path), path, match)


def test_a_layer_plans_layer_assign_that_is_a_list():
    """`layer_assign: [false]` beside a block: dict() of the list raised TypeError."""
    from firescale.nets.device_plan import read_layer_plan

    text = 'dist {\n  arch {\n    layer_assign { name: "conv1" device: 0 }\n    layer_assign: [false]\n  }\n}\n'
    path = scratch_file("plan.prototxt", text, "regressions")
    refused(lambda: read_layer_plan(path), path, r"dist \(train\) arch 0: layer_assign must be a block")


@pytest.mark.parametrize("value", ["{ net: 'x' }", "[1, 2]"])
def test_a_solver_type_that_is_a_block_or_a_list(value):
    """`solver_type` given a mapping: looking it up among the old names raised TypeError (unhashable)."""
    from firescale.caffe.solver import load_solver

    path = scratch_file("solver.yaml", f"base_lr: 0.01\nmax_iter: 10\nsolver_type: {value}\n", "regressions")
    refused(lambda: load_solver(path), path, "solver key 'solver_type' must be one of SGD")


def test_the_workflows_check_names_the_file_that_gives_a_bad_experiment_name():
    """A key the experiment names' pattern refuses was blamed on the command line's --config: the check looked
    for the key's name as a value in the file."""
    import yaml

    from firescale.sweep.config import check_workflow_config

    path = scratch_file("config.yaml", "site: local\nexperiments: {'00:15:00': null}\n", "regressions")
    config = yaml.safe_load(path.read_text())
    refused(lambda: check_workflow_config(config, [path]), path, r"config.yaml: key 'experiments': '00:15:00' is not "
                                                                 "allowed; expected an experiment name")


@pytest.mark.parametrize("solver, words", [
    ("workflow/solvers/lenet-digits.yamlworkflow/solvers/lenet-digits.yaml", "does not exist"),
    ("local", "the name must end in .prototxt"),
])
def test_an_experiments_missing_solver_names_the_file_and_the_experiment(repo, solver, words):
    """`make fuzz` (2026-12-02, seed 1796239251): a solver path the experiments file got wrong was refused in the
    solver file's words alone, naming neither the experiments file nor the experiment that gave it."""
    from firescale.cluster.site import load_site
    from firescale.sweep.config import load_config
    from firescale.sweep.plan import SweepPlan

    text = (repo / "tests" / "workflow" / "digits-lenet.yaml").read_text()   # the input the fuzzer changed
    path = scratch_file("config.yaml", "site: local\n" + text.replace("workflow/solvers/lenet-digits.yaml", solver),
                        "regressions")
    config = load_config(path)
    site = load_site(repo / "site" / "local" / "site.yaml")
    said = refused(lambda: SweepPlan.build(config, site, source=path, base=repo, check_limits=False), path,
                   rf"config.yaml: experiment digits-lenet: key 'solver': solver file .*{words}")
    assert solver.split("/")[-1] in said
