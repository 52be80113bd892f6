"""TensorFlow profiler captures of a running cluster, and their host events read back: what ps_profile and
step_parts share."""

from __future__ import annotations

from pathlib import Path


def capture(ports: list[int], logdir: Path, ms: int) -> None:
    """``ms`` of every task serving the profiler on ``ports`` (127.0.0.1), captured at once into ``logdir``."""
    from tfdist.tf_imports import tf

    addresses = ",".join(f"grpc://127.0.0.1:{port}" for port in ports)
    tf.profiler.experimental.client.trace(addresses, str(logdir), ms)


def host_events(path: Path) -> list[tuple[str, int, int]]:
    """Every host event of one captured task as ``(name, start, end)`` in picoseconds of the machine's clock
    (the tasks of one machine share it, so their events line up)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    found = []
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            found += [(names.get(event.metadata_id, "?"), base + event.offset_ps,
                       base + event.offset_ps + event.duration_ps) for event in line.events]
    return found
