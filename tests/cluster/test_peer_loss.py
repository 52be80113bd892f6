"""A lost peer, as TensorFlow tells a surviving task, becomes one line naming it (texts captured on tests/netns.py hosts)."""

import gc
import sys

import pytest

from tfdist.cluster.peer_loss import explain, peers_watched
from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.errors import RunError
from tfdist.tf_imports import tf

CLUSTER = {"worker": ["10.213.0.1:2222", "10.213.0.2:2222"]}
WORKER_0, WORKER_1 = ClusterTask(CLUSTER, "worker", 0), ClusterTask(CLUSTER, "worker", 1)

UNHEALTHY = ("Graph execution error:\n\nDetected at node while/Adam/CollectiveReduceV2 defined at (most recent call "
             "last):\n...\nCollective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are "
             "unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have crashed.")
HEARTBEAT_LOST = ("Graph execution error:\n\nCollective ops is aborted by: Deadline Exceeded\n\nRPC: "
                  "/tensorflow.CoordinationService/Heartbeat\nThe error could be from a previous operation.")
RESET = ("Graph execution error:\n\nCollective ops is aborted by: Socket closed\nAdditional GRPC error information from "
         "remote target /job:worker/replica:0/task:1 /job:worker/replica:0/task:1:\n:UNKNOWN:Error received from peer  "
         '{grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}')


def test_a_peer_that_stopped_sending_heartbeats_is_named_with_its_address_and_the_timeout():
    assert explain(UNHEALTHY, WORKER_0, 4).startswith(
        "worker-0 lost worker-1 (10.213.0.2:2222) during training: no heartbeat for 4 s (distributed.heartbeat_timeout)")


def test_the_task_cut_off_names_the_coordination_leader_it_lost():
    assert explain(HEARTBEAT_LOST, WORKER_1, 10).startswith(
        "worker-1 lost the cluster's coordination service on worker-0 (10.213.0.1:2222) during training")


def test_a_reset_connection_names_the_peer_and_grpc_s_reason():
    assert explain(RESET, WORKER_0, 10).startswith(
        "worker-0 lost worker-1 (10.213.0.2:2222) during training: recvmsg:Connection reset by peer; check that task's log")


def test_a_parameter_server_chief_names_the_lost_ps_not_the_worker_that_reported_it():
    cluster = {"chief": ["10.213.0.1:2222"], "worker": ["10.213.0.2:2222", "10.213.0.3:2222"], "ps": ["10.213.0.4:2222"]}
    text = ("Graph execution error:\n\nError reported from /job:worker/replica:0/task:0 (10.213.0.2:2222): failed "
            "reading a variable from 10.213.0.4:2222\n:UNKNOWN:Error received from peer ipv4:10.213.0.4:2222 "
            '{grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}')
    assert explain(text, ClusterTask(cluster, "chief", 0), 10).startswith(
        "chief-0 lost ps-0 (10.213.0.4:2222) during training: recvmsg:Connection reset by peer; ")


def test_a_ps_named_by_its_job_is_the_lost_one_too():
    cluster = {"chief": ["10.213.0.1:2222"], "worker": ["10.213.0.2:2222", "10.213.0.3:2222"], "ps": ["10.213.0.4:2222"]}
    text = ("Graph execution error:\n\nError reported from /job:worker/replica:0/task:1: Socket closed reading "
            "/job:ps/replica:0/task:0/device:CPU:0")
    assert explain(text, ClusterTask(cluster, "chief", 0), 10).startswith(
        "chief-0 lost ps-0 (10.213.0.4:2222) during training: Error reported from /job:worker")


def test_other_errors_are_not_taken_for_a_lost_peer():
    assert explain("Graph execution error:\n\nout of memory allocating tensor", WORKER_0, 10) is None


def test_peers_watched_raises_one_line_for_a_lost_peer_and_leaves_anything_else(monkeypatch):
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # put back whatever the blocks leave installed
    with pytest.raises(RunError, match=r"^worker-0 lost worker-1 \(10\.213\.0\.2:2222\)") as error:
        with peers_watched(WORKER_0, 4):
            raise tf.errors.UnavailableError(None, None, UNHEALTHY)
    assert error.value.__cause__ is None and "\n" not in str(error.value)
    hook = sys.unraisablehook
    with pytest.raises(tf.errors.InternalError):
        with peers_watched(WORKER_0, 4):
            raise tf.errors.InternalError(None, None, "a bug of ours")
    assert sys.unraisablehook is hook, "a block left by any other error puts the hook back"
    with pytest.raises(tf.errors.UnavailableError):  # not a cluster task: no peers to lose
        with peers_watched(None, 4):
            raise tf.errors.UnavailableError(None, None, UNHEALTHY)


class _DeletedWhileItsPeerIsGone:
    """What TensorFlow's Executor does when deleted after a peer went away: its __del__ raises the peer's error."""

    def __init__(self, error: Exception):
        self.error = error

    def __del__(self):
        raise self.error


def test_what_executors_raise_at_deletion_for_the_lost_peer_is_dropped_and_nothing_else(monkeypatch):
    printed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(unraisable.exc_value))
    with peers_watched(WORKER_0, 4):
        _DeletedWhileItsPeerIsGone(tf.errors.UnavailableError(None, None, RESET))
        _DeletedWhileItsPeerIsGone(ValueError("a bug of ours"))
        gc.collect()
    assert [type(error) for error in printed] == [ValueError], "only the lost peer's error is dropped"
    assert sys.unraisablehook is not None and printed[0].args == ("a bug of ours",)
    _DeletedWhileItsPeerIsGone(tf.errors.UnavailableError(None, None, RESET))
    gc.collect()
    assert len(printed) == 2, "outside the block, Python prints it as usual"
