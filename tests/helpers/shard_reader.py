"""One multi_worker_mirrored worker that reads an epoch of fit's training input and writes which digits it got.

Run as ``python tests/helpers/shard_reader.py OUT.json`` with TF_CONFIG set, one
process per worker: the images are numbered (image i's first two pixels are i's two bytes)
and written as prepared shards (12: each worker 4), the input is the one ``fit`` builds
(:meth:`tfdist.train.fit.FitPlan.train_input`), and the worker records the numbers in its own replicas' batches over an epoch's
steps, and how many digits its input pipeline batched (a counting step put
before every ``batch``), so a test can count each worker's share and its
input work.
"""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from tfdist.data.prepared import DataSpec, SplitWriter
from tfdist.tf_imports import tf
from tfdist.train.fit import FitPlan

DIGITS, PER_REPLICA_BATCH = 6000, 25

batched: list[int] = []


def counted_batches(batch):  # noqa: ANN001, ANN202
    """``Dataset.batch`` with a count of the digits that reach it, the input work a worker does."""

    def counting_batch(dataset, *args, **kwargs):  # noqa: ANN001, ANN202
        def count(*element):  # noqa: ANN002, ANN202 - a record, as the shards are read
            counted = tf.py_function(lambda: batched.append(1) or 0, [], tf.int32)
            with tf.control_dependencies([counted]):
                return tuple(tf.identity(part) for part in element) if len(element) > 1 else tf.identity(element[0])

        return batch(dataset.map(count), *args, **kwargs)

    return counting_batch


def main(out: str) -> None:
    tf.data.Dataset.batch = counted_batches(tf.data.Dataset.batch)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    ids = np.arange(DIGITS)
    images = np.zeros((DIGITS, 28, 28, 1), dtype=np.uint8)
    images[:, 0, 0, 0], images[:, 0, 1, 0] = ids // 256, ids % 256
    folder = Path(tempfile.mkdtemp(prefix="tfdist-shards-"))
    writer = SplitWriter("train", folder, DataSpec("numbered", (28, 28, 1), tuple("0123456789")), DIGITS,
                         shards=4 * workers)  # files that share out evenly: every worker an equal 1/N
    writer.write(images, (ids % 10).astype(np.int64))
    digits = writer.close()
    global_batch = PER_REPLICA_BATCH * workers
    plan = FitPlan(global_batch=global_batch, steps=DIGITS // global_batch, learning_rate=0.001, warmup_steps=0,
                   asynchronous=False, val_batch=global_batch, val_steps=None, shards=0, workers=workers)
    data = plan.train_input(digits, seed=1, strategy=strategy)
    if isinstance(data, tf.data.Dataset):  # as fit distributes a dataset it is given
        data = strategy.experimental_distribute_dataset(data)
    iterator = iter(data)
    read = []
    for _ in range(plan.steps):
        x, _labels = next(iterator)
        for local in strategy.experimental_local_results(x):
            pixels = np.rint(local.numpy()[:, :2] * 255).astype(int)  # scaled to [0, 1] by the input
            read.extend((pixels[:, 0] * 256 + pixels[:, 1]).tolist())
    with open(out, "w") as file:
        json.dump({"read": read, "batched": len(batched), "steps": plan.steps, "workers": workers}, file)


if __name__ == "__main__":
    main(sys.argv[1])
