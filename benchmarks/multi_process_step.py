"""Benchmark: the multi-process strategies' step, this checkout against an earlier commit, side by side.

multi_worker_mirrored x2 and parameter_server (2 workers, 1 ps) through the
real train stage on loopback, per-replica batch 25 (and whatever ``--batches``
names), the prepared digits tiled to 12,000; normal training alongside as the
yardstick. A step is one synchronous step of the cluster, or under
parameter_server one worker's step (its two workers step at once, so the
cluster's pace is twice that: the compare report's "per worker" step). The
earlier commit (``--before``, a git revision) runs from a worktree of it, with
the same interpreter and packages; the two alternate round by round, so both
see the same machine.

    python -m benchmarks multi_process_step [--before af98ce3] [--rounds 2] [--epochs 4]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import step_ms, table
from benchmarks.results import median
from benchmarks.stage import data_folder, run  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIGS = [  # label, strategy, overrides, units taking steps at once
    ("normal", "default", [], 1),
    ("multi_worker_mirrored x2", "multi_worker_mirrored", ["distributed.workers=2"], 1),
    ("parameter_server 2 workers", "parameter_server", ["distributed.workers=2", "distributed.ps=1"], 2),
]


def worktree(revision: str, root: Path) -> Path:
    """A checkout of ``revision`` under ``root`` (git worktree, removed with ``git worktree prune``)."""
    folder = root / f"before-{revision}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), revision],
                   check=True, capture_output=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="af98ce3", help="the git revision to measure against")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batches", type=int, nargs="+", default=[25])
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a knob for both, key=value")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-mpstep-"))
    data = data_folder(root)
    before = worktree(args.before, root)
    try:
        for batch in args.batches:
            steps: dict[tuple[str, str], list[float]] = {}
            for round_ in range(args.rounds):
                for label, strategy, sets, units in CONFIGS:
                    for side, checkout in ((args.before, before), ("this checkout", None)):
                        report = run(root, data, f"b{batch}-r{round_}-{strategy}-{'before' if checkout else 'after'}",
                                     strategy, [*sets, *args.sets, f"train.batch_size={batch}",
                                                f"train.epochs={args.epochs}"], checkout)
                        ms = units * step_ms(report)
                        steps.setdefault((label, side), []).append(ms)
                        print(f"batch {batch} round {round_ + 1} {label} [{side}]: {ms:.2f} ms/step, "
                              f"val_accuracy {report['val_accuracy']:.4f}", file=sys.stderr, flush=True)
            rows = []
            for label, *_ in CONFIGS:
                old, new = median(steps[(label, args.before)]), median(steps[(label, "this checkout")])
                rows.append([label, f"{old:.2f}", f"{new:.2f}", f"{old / new:.2f}x",
                             " ".join(f"{s:.2f}" for s in steps[(label, args.before)]),
                             " ".join(f"{s:.2f}" for s in steps[(label, "this checkout")])])
            print(f"per-replica batch {batch}, 12,000 digits, {args.epochs} epochs, median of {args.rounds} alternating rounds")
            print(table(["run", f"ms/step at {args.before}", "ms/step now", "faster", "runs before", "runs now"], rows))
            print()
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], capture_output=True)


if __name__ == "__main__":
    main()
