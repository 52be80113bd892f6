"""A run's names and places: where it reads and writes, the repeat stage's rounds of it, its title in MLflow."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Where a run's traces go (``train.profile_steps``): the folder, under a task's scratch, each task writes into (its
#: own folder inside, TensorBoard's layout ``<task>/plugins/profile/<moment>/<host>.xplane.pb``), and the run's MLflow
#: artifact path for them.
PROFILE_FOLDER = "profile"


@dataclass(frozen=True)
class RunPaths:
    """Where a run reads and writes.

    Attributes:
        prepared: the prepared data folder (train/val/test.npz).
        model: the folder that receives the saved model.
        backups: the root of per-run backups (resume after a crash).
        reports: the folder for the run's report (NAME.json) and history (history/NAME.csv),
            written with the model, all or none; None: the caller writes them.
    """

    prepared: Path
    model: Path
    backups: Path
    reports: Path | None = None


@dataclass(frozen=True)
class Repeat:
    """Round ``round`` (2 or more) of run ``name``: the repeat stage trains it as run :attr:`label` (``compare.repeats``)."""

    name: str
    round: int

    @property
    def label(self) -> str:
        """Its run name: ``mirrored.r2``."""
        return repeat_name(self.name, self.round)


def repeat_name(name: str, round_: int) -> str:
    """The run name of round ``round_`` of run ``name``; round 1 is the run itself."""
    return name if round_ == 1 else f"{name}.r{round_}"


def planned(run_names: Sequence[str], repeats: int) -> list[Repeat]:
    """Rounds 2 to ``repeats`` of every run, in the order they train: round by round, runs in order within each."""
    return [Repeat(name, round_) for round_ in range(2, repeats + 1) for name in run_names]


def run_label(name: str, *, strategy: str, replicas: int, workers: int, ps: int, loop: str, precision: str,
              clip: str = "none", compression: str = "none", distributes: bool = True) -> str:
    """A run's title in MLflow, saying what differs between runs: ``mirrored ×2 · fit · float32``.

    The scale is the replicas in sync, or workers and parameter servers; the
    strategy is named apart when the run's name is not the strategy's and it
    ``distributes`` (undistributed training needs no strategy in its title).
    """
    scale = f" {workers}w+{ps}ps" if ps else (f" ×{replicas}" if replicas > 1 else "")
    head = f"{name}{scale}" if name == strategy or not distributes else f"{name} ({strategy}{scale})"
    return " · ".join([head, loop, precision, *([f"clip {clip}"] if clip != "none" else []),
                       *([f"{compression} gradients"] if compression != "none" else [])])
