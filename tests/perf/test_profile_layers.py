"""profile_layers: a real Keras model timed layer by layer on this CPU, written as a Table VI trace."""
from __future__ import annotations

import numpy as np
import pytest

from firescale.model.traces import profile_layers, read_trace, replay_trace, write_trace


def test_profile_a_small_lenet(tmp_path):
    tf = pytest.importorskip("tensorflow")
    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(20, 5, padding="same", name="conv1"),
        tf.keras.layers.MaxPooling2D(2, name="pool1"),
        tf.keras.layers.Flatten(name="flatten"),
        tf.keras.layers.Dense(10, name="ip2"),
    ])
    images = np.random.default_rng(0).random((16, 8, 8, 1), dtype=np.float32)
    labels = np.arange(16) % 10
    trace = profile_layers(model, images, labels, repeats=3)
    assert [r.name for r in trace] == ["conv1", "pool1", "flatten", "ip2"]
    assert all(r.forward_us > 0 and r.backward_us > 0 for r in trace)
    assert trace[0].gradient_bytes == (5 * 5 * 1 * 20 + 20) * 4
    assert trace[3].gradient_bytes == (4 * 4 * 20 * 10 + 10) * 4
    assert trace[1].gradient_bytes == 0 and all(r.comm_us == 0 for r in trace)
    again = read_trace(write_trace(tmp_path / "lenet.csv", trace))
    assert replay_trace(again).iteration == pytest.approx(sum(r.forward_us + r.backward_us for r in trace),
                                                          rel=1e-4)
