"""Each multi_worker_mirrored worker reads only its shard: counted on real worker processes over loopback."""

import json
import subprocess
import sys
from collections import Counter

import pytest

from tfdist.cluster.ports import LOOPBACK, free_ports, release_ports

from helpers import shard_reader
from helpers.project import REPO, local_mode_environment

pytestmark = pytest.mark.slow

WORKERS = 3


def test_each_of_three_workers_reads_a_third_of_an_epoch_and_together_distinct_digits(tmp_path):
    ports = free_ports(WORKERS)
    cluster = {"worker": [f"{LOOPBACK}:{port}" for port in ports]}
    tasks = [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}) for i in range(WORKERS)]
    environments = [{**local_mode_environment(), "TF_CONFIG": task} for task in tasks]
    processes = []
    try:
        for i in range(WORKERS):
            with open(tmp_path / f"worker-{i}.log", "w") as log:
                processes.append(subprocess.Popen([sys.executable, shard_reader.__file__, str(tmp_path / f"worker-{i}.json")],
                                                  cwd=REPO, env=environments[i], stdout=subprocess.DEVNULL, stderr=log))
        for i, process in enumerate(processes):
            assert process.wait(timeout=180) == 0, (tmp_path / f"worker-{i}.log").read_text()[-3000:]
    finally:
        for process in processes:
            process.kill()
        release_ports(ports)
    shares = [json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in range(WORKERS)]
    epoch = shares[0]["steps"] * shard_reader.PER_REPLICA_BATCH * WORKERS
    assert shares[0]["workers"] == WORKERS and epoch == shard_reader.DIGITS
    for share in shares:
        assert len(share["read"]) == epoch // WORKERS, "each worker produces its 1/N of an epoch's examples, no more"
        assert len(set(share["read"])) == len(share["read"]), "and reads each of its digits once an epoch"
        # its input pipeline batched its shard (and up to a few chunks of records read ahead to be decoded
        # together), not every global batch
        assert epoch // WORKERS <= share["batched"] < 2 * epoch / WORKERS, share["batched"]
    together = Counter(digit for share in shares for digit in share["read"])
    assert len(together) == epoch and max(together.values()) == 1, "the workers' shards are disjoint and cover the epoch"
