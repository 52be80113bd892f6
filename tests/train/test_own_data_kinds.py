"""Every model kind trains on the user's own images: colour, 16x16, 3 classes named by the data, under mirrored
and as two worker processes under multi_worker_mirrored, their gradients sent in 16 bits (a builder's, through
DVC and uncompressed: tests/pipeline).

The shape and the classes come from the prepared data (its spec.json), never
from MNIST: the MLP flattens them, the convnet sees the images as they are, a
builder is called with them; the saved model's signature, the evaluation's
per-class numbers and confusion matrix speak the classes' names.
"""

import json
import shutil
import subprocess

import numpy as np
import pytest

from tfdist.config.knobs import DataConfig
from tfdist.config.params import load_config
from tfdist.data.prepared import load_spec, load_split, scaled
from tfdist.data.sources import RawImages
from tfdist.data.stage import write_prepared
from tfdist.distribute.builders import build_strategy
from tfdist.distribute.registry import get_spec
from tfdist.evaluate.stage import evaluate_model
from tfdist.runtime.allocator import allocator_library
from tfdist.train.fit import train_model
from tfdist.train.models import export_copy

from helpers.digits import colour_set
from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command

KINDS = [("mlp", {}), ("cnn", {}), ("builder", {"builder": "user_models.lenet:build"})]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A prepared colour set: 3 classes of 16x16x3 images, named."""
    folder = tmp_path_factory.mktemp("parts")
    x, y = colour_set(900, classes=3)
    write_prepared(RawImages("parts", x, y, class_names=("bolt", "nut", "gear")), DataConfig(), 0, folder / "prepared")
    return folder / "prepared"


@pytest.mark.parametrize(("kind", "model"), KINDS, ids=[k for k, _ in KINDS])
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_every_kind_learns_the_users_colour_images(tmp_path, parts, kind, model, strategy):
    config = load_config(tiny_params(tmp_path, model={"kind": kind, **model}, train={"epochs": 3, "batch_size": 16}))
    data = load_spec(parts)
    assert data.describe() == "parts (16x16x3, 3 classes)"
    spec = get_spec(strategy)
    tf_strategy, info = build_strategy(spec, config.distributed.devices)
    result = train_model(config, spec, tf_strategy, info, data=data, train=load_split(parts, "train", data),
                         val=load_split(parts, "val", data))
    model = export_copy(result.model, config.model, data)
    assert model.input_shape == (None, 16 * 16 * 3) and model.output_shape == (None, 3)
    test = load_split(parts, "test", data).read()
    metrics, predicted = evaluate_model(model, test, data)
    assert metrics["accuracy"] > 0.9, f"{kind} under {strategy} learns the colours: {metrics['accuracy']:.3f}"
    assert set(metrics["per_class"]) == {"bolt", "nut", "gear"} and len(predicted) == len(test)
    np.testing.assert_allclose(model.predict(scaled(test.x[:4]), verbose=0).sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "loop", "compression", "allocator"),
                         [("mlp", "fit", "float16", "auto"), ("cnn", "custom", "bfloat16", "system")])
def test_two_workers_train_each_kind_on_the_users_colour_images(tmp_path, parts, kind, loop, compression, allocator):
    """The train stage under multi_worker_mirrored, two local worker processes reading spec.json, not MNIST's shape;
    their gradients cross in 16 bits (distributed.gradient_compression) under either loop: half the bytes, still learnt;
    the processes run with runtime.allocator's library (the stage started itself again with it preloaded) or glibc's."""
    shutil.copytree(parts, tmp_path / "data" / "prepared")
    tiny_params(tmp_path, model={"kind": kind}, train={"epochs": 3, "batch_size": 16, "loop": loop},
                distributed={"strategies": ["multi_worker_mirrored"], "gradient_compression": compression},
                runtime={"allocator": allocator})
    done = subprocess.run(train_stage_command(tmp_path, "multi_worker_mirrored"), cwd=REPO, env=local_mode_environment(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "reports" / "multi_worker_mirrored.json").read_text())
    assert report["dataset"] == "parts (16x16x3, 3 classes)" and report["workers"] == 2, report
    assert report["val_accuracy"] > 0.9, f"{kind} on two workers learns the colours: {report['val_accuracy']}"
    assert report["gradient_compression"] == compression and report["run_label"].endswith(f"{compression} gradients")
    assert report["allocator"] == allocator_library(allocator, kind)[0], "jemalloc where installed (make install), else glibc's"
    parameters = report["params_per_device"][0]
    assert report["bytes_per_step"] == 2 * (2 - 1) * parameters * 2, "a ring of 2 sends each gradient's 2 bytes twice"
    assert abs(report["collectives"]["large_bytes"] - parameters * 2) < 4, "calibrated at the bytes sent (in float32s)"
    alone = report["collectives"]["compute_samples"]
    assert len(alone) == 5 and report["collectives"]["compute_seconds"] == sorted(alone)[2] > 0, "one replica's step timed"
