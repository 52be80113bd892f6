"""TensorFlow's native start-up chatter stays off a stage's stderr; errors, and everything of Python's, pass."""

import os
import subprocess
import sys
import textwrap

import pytest

from tfdist.native_logs import ChatterFilter, is_chatter

from helpers.project import REPO, tiny_params

CHATTER = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"I0000 00:00:1796043301.682100   15878 port.cc:153] oneDNN custom operations are on.",
    b"I0000 00:00:1796043301.682745   15878 cudart_stub.cc:31] Could not find cuda drivers on your machine",
    b"W1130 12:00:01.000001    4242 grpc_server.cc:99] some warning",
]
CUDA_PROBE = b"E0000 00:00:1796043331.124173   16115 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error"
KEPT = [
    b"E0000 00:00:1796043331.1   16115 collective_ops.cc:9] The following tasks are unhealthy: /job:worker/task:1",
    b"F0000 00:00:1.2   1 check.cc:1] Check failed",
    b"error: train.epochs must be >= 1; got 0",
    b"Traceback (most recent call last):",
    b"INFO tfdist.train.stage: cluster mode: this process is worker-0 of 2 workers",
]


def test_chatter_is_told_apart_from_what_matters():
    assert all(is_chatter(line, has_nvidia_driver=False) for line in CHATTER)
    assert not any(is_chatter(line, has_nvidia_driver=False) for line in KEPT)
    assert is_chatter(CUDA_PROBE, has_nvidia_driver=False)
    assert not is_chatter(CUDA_PROBE, has_nvidia_driver=True), "with a driver installed, a CUDA failure matters"


#: What a surviving multi_worker_mirrored worker printed when its peer's cable was cut (tests/netns.py), then Python's lines.
ABORTED_COLLECTIVES = b"""\
E0000 00:00:1796061354.991002    8986 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: \
Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to \
debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='\\"\\n\\n\\x06worker\\x10\\x01']
E0000 00:00:1796061355.110517    9191 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort \
DEADLINE_EXCEEDED: Deadline Exceeded

RPC: /tensorflow.CoordinationService/Heartbeat
E0000 00:00:1796061354.991205    8986 ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: Collective ops is aborted by: \
Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The error could be from a previous operation. Restart your program to reset. [type.googleapis.com/tensorflow.DerivedStatus='']
error: worker-0 lost worker-1 (10.213.0.2:2222) during training
E0000 00:00:1.2   1 other.cc:1] some other error
/job:worker/replica:0/task:1 is shown after an unrelated record
"""


def test_records_of_collectives_aborted_for_a_lost_peer_are_dropped_with_their_continuation_lines():
    chatter = ChatterFilter(has_nvidia_driver=False)
    shown = [line for line in ABORTED_COLLECTIVES.split(b"\n") if chatter.shows(line)]
    assert shown == [b"error: worker-0 lost worker-1 (10.213.0.2:2222) during training",
                     b"E0000 00:00:1.2   1 other.cc:1] some other error",
                     b"/job:worker/replica:0/task:1 is shown after an unrelated record", b""]


WRITER = textwrap.dedent("""
    import os, sys
    from tfdist import native_logs
    assert native_logs.filter_native_stderr()
    for line in {lines!r}:
        os.write(2, line + b"\\n")       # as native code writes: straight to the descriptor
    print("python's own stderr", file=sys.stderr)
    native_logs.restore()
    os._exit(3)                          # the way the launcher's watchdog leaves
""")


def test_the_filter_drops_chatter_keeps_the_rest_and_loses_nothing_on_a_hard_exit():
    code = WRITER.format(lines=[*CHATTER, *KEPT])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 3
    assert result.stderr.decode().splitlines() == [line.decode() for line in KEPT] + ["python's own stderr"]


@pytest.mark.parametrize(("show", "chatter_shown"), [(None, False), ("1", True)])
def test_a_stage_that_loads_tensorflow_prints_only_its_own_lines(tmp_path, prepared_copy, show, chatter_shown):
    tiny_params(tmp_path, train={"batch_size": 100_000})
    env = {key: value for key, value in os.environ.items() if key != "TFDIST_TF_LOGS"}
    if show:
        env["TFDIST_TF_LOGS"] = show
    # train loads TensorFlow and builds the strategy before it finds the batch larger than the data: exit 2, one line
    result = subprocess.run([sys.executable, str(REPO / "stages" / "train.py"), "--strategy", "default", "--name", "big"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("INFO ")]
    assert lines[-1].startswith("error: train.batch_size 100000 x 1 replicas"), lines
    assert (len(lines) > 1) is chatter_shown, lines


def test_a_program_that_replaces_a_filtered_process_keeps_a_working_stderr():
    code = textwrap.dedent("""
        import sys
        from tfdist import native_logs
        assert native_logs.filter_native_stderr()
        native_logs.exec_program(sys.executable, [sys.executable, "-c",
                                 "import sys; sys.stderr.write('after exec\\\\n'); sys.exit(4)"])
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (4, "after exec\n")
