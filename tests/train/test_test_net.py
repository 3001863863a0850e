"""A solver's test_net, what test_iter counts, and the net file in result.json: the test net's file found as the
net: line is, its learnable layers checked against the trained net's, the evaluation cut at test_iter x the test
batch_size, and two real ranks training a net file with the batch, test batch and hash the files give."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits

from firescale.caffe.solver import ignored_note, load_solver
from firescale.errors import FirescaleError

TINY = Path(__file__).parents[1] / "caffe" / "net_files" / "tiny_resnet.prototxt"
SOLVER = 'net: "nets/train.prototxt"\ntest_net: "nets/test.prototxt"\nbase_lr: 0.01\nmax_iter: 2\n'


def _files(root: Path, test_text: str | None = None) -> Path:
    (root / "nets").mkdir(exist_ok=True)
    (root / "nets" / "train.prototxt").write_text(TINY.read_text())
    (root / "nets" / "test.prototxt").write_text(TINY.read_text() if test_text is None else test_text)
    (root / "solver.prototxt").write_text(SOLVER)
    return root / "solver.prototxt"


def test_the_test_net_is_read_beside_the_solver_and_not_called_ignored(tmp_path):
    from firescale.train.net_file import test_net_path

    solver = _files(tmp_path)
    cfg = load_solver(solver)
    assert test_net_path(cfg, solver) == tmp_path / "nets" / "test.prototxt"
    assert "test_net" not in ignored_note(cfg)
    solver.write_text(SOLVER.replace("nets/test.prototxt", "nets/gone.prototxt"))
    with pytest.raises(FirescaleError, match=r"solver.prototxt: test_net: 'nets/gone.prototxt' names no file"):
        test_net_path(load_solver(solver), solver)
    # two test nets (each with its test_iter): not read, the test split evaluated whole, as before
    solver.write_text(SOLVER + 'test_net: "nets/test.prototxt"\n')
    cfg = load_solver(solver)
    assert test_net_path(cfg, solver) is None and "test_net" in ignored_note(cfg)


def test_a_test_net_whose_learnable_layers_differ_is_refused_naming_both_files(tmp_path):
    from firescale.nets.zoo import get_net
    from firescale.train.net_file import check_test_net

    wider = TINY.read_text().replace("num_output: 8 kernel_h: 3", "num_output: 6 kernel_h: 3")
    solver = _files(tmp_path, wider)
    spec = get_net(str(tmp_path / "nets" / "train.prototxt"), input_shape=(8, 8, 1))
    test = tmp_path / "nets" / "test.prototxt"
    with pytest.raises(FirescaleError) as err:
        check_test_net(spec, test)
    assert str(err.value).startswith(f"{test}: the solver's test_net differs from the trained net "
                                     f"{tmp_path / 'nets' / 'train.prototxt'} in the learnable layer 'res_a' "
                                     f"(blobs 6x8x3x1 against 8x8x3x1)")
    # other names for the data layers: the learnable layers are what must agree
    _files(tmp_path, TINY.read_text().replace('name: "data"', 'name: "input"'))
    check_test_net(spec, test)
    with pytest.raises(FirescaleError, match=r"differs from the trained net 'lenet_same' in the learnable layer "
                                             r"'conv1'"):
        check_test_net(get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1)), test)
    assert solver.is_file()


@pytest.mark.tensorflow
def test_the_evaluation_stops_at_this_ranks_share_of_the_images():
    import tensorflow as tf

    from firescale.train.evaluation import evaluate, rank_share
    from firescale.train.tensorflow.evaluation import make_eval_step

    assert [rank_share(10, r, 3) for r in range(3)] == [4, 3, 3] and rank_share(2, 2, 3) == 0
    step = make_eval_step(lambda images, training: images, 4, (4,))   # the images are the logits
    images = tf.constant(np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]])
    labels = tf.constant([0, 1, 2, 3, 0, 1, 2, 3, 1, 1], tf.int64)     # the last two: one right, one wrong
    batches = [(images[i:i + 4], labels[i:i + 4]) for i in range(0, 10, 4)]
    sums = evaluate(step, batches, np.asarray, max_images=6)
    assert (sums.count, sums.top1_correct) == (6.0, 6.0)
    sums = evaluate(step, batches, np.asarray)
    assert (sums.count, sums.top1_correct) == (10.0, 9.0)


@pytest.mark.tensorflow
@pytest.mark.mpi
@pytest.mark.slow
def test_two_ranks_take_the_batch_and_test_batch_from_the_files_and_record_the_net_file(tmp_path, run_ranks):
    root = ingest_digits(tmp_path)
    test_text = TINY.read_text().replace("digits_test_lmdb\" batch_size: 16", "digits_test_lmdb\" batch_size: 12")
    solver = _files(root, test_text)
    solver.write_text(SOLVER + "test_iter: 5\ntest_initialization: false\nsnapshot_after_train: false\n")
    proc = run_ranks(2, ["train", "--dataset", str(root / "digits"), "--solver", str(solver), "--out",
                         str(root / "run"), "--split-every", "1"], timeout=300)
    train = root / "nets" / "train.prototxt"
    assert f"{train}: the TRAIN data layer 'data' batch_size: 16 is the batch per rank, as Caffe's is per GPU" \
        in proc.stdout
    assert ("each evaluation reads the first 60 test images: test_iter 5 x batch_size 12 of the TEST data layer "
            f"'data' in {root / 'nets' / 'test.prototxt'}") in proc.stdout
    assert "eval iter 2: " in proc.stdout and "(60 images in " in proc.stdout
    result = json.loads((root / "run" / "result.json").read_text())
    assert (result["batch"]["batch_per_rank"], result["ranks"]) == (16, 2)
    digest = hashlib.sha256(train.read_bytes()).hexdigest()
    assert result["net_file"] == {"path": str(train.resolve()), "sha256": digest}
    test = root / "nets" / "test.prototxt"
    test_digest = hashlib.sha256(test.read_bytes()).hexdigest()
    assert result["test_net_file"] == {"path": str(test.resolve()), "sha256": test_digest}
