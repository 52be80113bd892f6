"""The oneDNN pass's output read from a real graph: a pooling gradient it left to Eigen is named, every task retraces
its train function together to be rid of it, and the run's report says what each check found."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import mlflow
import pytest

from tfdist.compare.compute import build_comparison
from tfdist.compare.render import render_markdown
from tfdist.records.reports import fallbacks_in_words
from tfdist.train.kernels import fallbacks

from helpers.project import local_mode_environment, tiny_params, train_stage_command
from helpers.reports import eval_report, train_report


def test_an_op_left_unrewritten_beside_its_rewritten_kind_or_forward_op_is_a_fallback():
    ops = ["_MklNativeMaxPool", "MaxPoolGrad", "MaxPoolGrad", "_MklNativeFusedConv2D", "MatMul", "BiasAddGrad"]
    assert fallbacks(ops) == {"MaxPoolGrad": 2}
    assert fallbacks(["_MklNativeMaxPool", "_MklNativeMaxPoolGrad", "Conv2D", "Conv2DBackpropFilter"]) == {}
    assert fallbacks_in_words({"worker-0": {}, "worker-1": {"MaxPoolGrad": 2}, "worker-2": None}) == "MaxPoolGrad x2 in worker-1"


def test_the_comparison_names_each_run_left_on_eigens_kernels_and_whether_a_retrace_was_rid_of_it():
    left = {"worker-0": {}, "worker-1": {"MaxPoolGrad": 1}}
    gone, kept, clean = ([left, {"worker-0": {}, "worker-1": {}}], [left] * 4, [{"worker-0": {}, "worker-1": {}}])
    reports = {"normal": train_report("default", 10.0)}
    for name, checks in (("mwms", gone), ("mwms_2", kept), ("mwms_3", clean)):
        reports[name] = replace(train_report("multi_worker_mirrored", 9.0, 2), name=name, kernel_checks=checks)
    markdown = render_markdown(build_comparison(reports, {name: eval_report(name, 0.95, 0.2) for name in reports}))
    assert ("**Eigen's kernels:** mwms: MaxPoolGrad x1 in worker-1, gone after 1 retrace(s); mwms_2: MaxPoolGrad x1 "
            "in worker-1, still after 3 retrace(s). oneDNN's pass") in markdown, markdown
    assert "mwms_3:" not in markdown.split("**Eigen's kernels:**")[1].split("\n")[0]


#: A pooling whose gradient is a MaxPoolGrad fed from another op than the pooling: oneDNN's pass rewrites the pooling
#: and leaves this gradient to Eigen, in every graph (the fallback forced, where TensorFlow's own happens by chance).
POOL_LEFT_TO_EIGEN = """
import tensorflow as tf

@tf.custom_gradient
def pool(x):
    y = tf.nn.max_pool2d(x, 2, 2, "VALID")

    def grad(dy):
        again = tf.nn.avg_pool2d(x, 2, 2, "VALID") * 0.0 + tf.stop_gradient(y)
        return tf.raw_ops.MaxPoolGrad(orig_input=x, orig_output=again, grad=dy, ksize=[1, 2, 2, 1],
                                      strides=[1, 2, 2, 1], padding="VALID")
    return y, grad
"""

FORCED = POOL_LEFT_TO_EIGEN + """
from tfdist.train.kernels import collected_graphs, fallbacks

@tf.function
def step(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(pool(x) ** 2)
    return tape.gradient(loss, x)

with collected_graphs() as ops:
    step(tf.random.uniform((4, 8, 8, 3)))
print(fallbacks(ops))
"""

#: A user's convnet (model.builder) with that pooling.
BUILDER = POOL_LEFT_TO_EIGEN + """
import tf_keras as keras


class PoolLeftToEigen(keras.layers.Layer):
    def call(self, x):
        return pool(x)


def build(input_shape, classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Conv2D(4, 3, activation="relu"), PoolLeftToEigen(),
                             keras.layers.Flatten(), keras.layers.Dense(classes, activation="softmax")])
"""
RETRACES = 2
FORCED_RUN = {"model": {"kind": "builder", "builder": "pool_left_to_eigen:build"},
              "train": {"epochs": 1, "steps_per_execution": 5},
              "runtime": {"onednn": "enabled", "onednn_retraces": RETRACES}}


def test_a_pooling_gradient_the_pass_could_not_rewrite_is_found_in_the_collected_graphs():
    done = subprocess.run([sys.executable, "-c", FORCED], env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "{'MaxPoolGrad': 1}"


@pytest.mark.slow
def test_a_run_left_on_eigens_pooling_gradient_retraces_then_trains_on_and_its_report_says_so(tmp_path, prepared_copy):
    (tmp_path / "pool_left_to_eigen.py").write_text(BUILDER)
    tiny_params(tmp_path, **FORCED_RUN)  # oneDNN on in the stage's process (runtime.onednn), not in this one
    done = subprocess.run(train_stage_command(tmp_path, "default", "forced"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "reports" / "forced.json").read_text())
    twice = {"chief": {"MaxPoolGrad": 2}}  # the steps before a call's last, and its last, traced apart
    assert report["kernel_checks"] == [twice] * (RETRACES + 1), "checked after each retrace"
    assert f"Eigen's MaxPoolGrad x2 in chief after {RETRACES} retraces (runtime.onednn_retraces)" in done.stderr


@pytest.mark.slow
def test_every_worker_retraces_together_and_the_cluster_trains_on(tmp_path, prepared_copy):
    (tmp_path / "pool_left_to_eigen.py").write_text(BUILDER)
    tiny_params(tmp_path, **FORCED_RUN)
    done = subprocess.run(train_stage_command(tmp_path, "multi_worker_mirrored", "forced"), cwd=tmp_path,
                          env=local_mode_environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "reports" / "forced.json").read_text())
    both = {"worker-0": {"MaxPoolGrad": 2}, "worker-1": {"MaxPoolGrad": 2}}
    assert report["kernel_checks"] == [both] * (RETRACES + 1), "each worker's finding, tallied the same on both"
    assert done.stderr.count("every task retraces its train function") == 2 * RETRACES, done.stderr[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    tags = mlflow.MlflowClient().get_run(report["mlflow_run_id"]).data.tags
    left = "MaxPoolGrad x2 in worker-0; MaxPoolGrad x2 in worker-1"
    assert tags["tfdist.eigen_kernels"] == f"{left}; after {RETRACES} retrace(s): {left}"
