"""Repeats: every training of the comparison run again, round after round, interleaved.

One run of each strategy is one sample of a machine whose speed moves more than
many differences the comparison reports. With ``compare.repeats: N``, the
pipeline's train stages are round 1 and the repeat stage runs rounds 2 to N, each
round in the order normal, s1, s2, ... (``distributed.strategies``), so that a
machine that drifts during the pipeline drifts under every strategy alike, as the
benchmarks alternate. Each repeat is the train stage itself, run as a child
process under the run name ``NAME.rK`` (its own MLflow run in the execution, its
model, report and history in the repeat stage's output, ``repeats/``); the comparison then
rests on the spread between rounds (:mod:`tfdist.compare.compute`).

A repeat is kept while the round-1 run it was made beside is unchanged: the
manifest (``repeats.json`` in the stage's output folder) records the digest of that run's
report for each finished repeat. DVC reruns round 1 whenever anything that
decides a training changes, which changes its report, so a kept repeat is never
stale; a changed repeat count runs only the rounds it adds (and removes those
it drops), and a rerun after a failed repeat runs only the ones left.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tfdist.cluster.processes import ProcessGroup
from tfdist.config.knobs import NORMAL_RUN, Config
from tfdist.distribute.registry import NORMAL_STRATEGY
from tfdist.errors import InputError, RunError
from tfdist.files import atomic
from tfdist.records.run_names import Repeat, planned

log = logging.getLogger(__name__)

#: The manifest of finished repeats, among the repeat stage's reports.
MANIFEST = "repeats.json"
#: Seconds a repeat's training gets, once asked to stop (Ctrl-C, SIGTERM), to end its MLflow run and clean up.
STOP_SECONDS = 60.0


def report_digest(path: Path) -> str:
    """The sha256 of a round-1 report: what a repeat made beside it is kept against."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class RepeatPaths:
    """Where round 1's reports are read, and the repeats written: ``out`` holds their models, reports and manifest.

    One folder, so that the stage's one DVC output is never empty (it holds the
    manifest even where there is no repeat to train).
    """

    first_reports: Path
    data: Path
    out: Path
    backups: Path

    @property
    def models(self) -> Path:
        return self.out / "models"

    @property
    def reports(self) -> Path:
        """NAME.rK.json and history/NAME.rK.csv, as the train stage writes them."""
        return self.out / "reports"


def run_repeats(config: Config, paths: RepeatPaths, train_command: Callable[..., list[str]]) -> list[Repeat]:
    """Train every missing repeat, in order; remove what is no longer planned; return the repeats trained.

    Args:
        train_command: the train stage's command for one run, given its ``strategy``, ``name`` and paths
            (``data``, ``models``, ``reports``, ``backups``): ``stages.train.run_command`` with these params.

    Raises:
        InputError: a round-1 report is missing (run the train stages first).
        RunError: a repeat's training failed: named, the repeats finished before it kept.
    """
    repeats = planned(config.run_names, config.compare.repeats)
    digests = {name: _first_digest(paths.first_reports, name) for name in config.run_names}
    manifest = _read_manifest(paths.out)
    kept = {r.label: manifest[r.label] for r in repeats
            if manifest.get(r.label) == digests[r.name] and _outputs_of(paths, r.label)[1].is_file()}
    _write_manifest(paths.out, kept)
    _remove_unplanned(paths, {r.label for r in repeats})
    todo = [r for r in repeats if r.label not in kept]
    if kept:
        log.info("kept %d finished repeat(s), made beside the same round-1 runs: %s", len(kept), ", ".join(kept))
    for index, repeat in enumerate(todo):
        log.info("repeat %s: round %d of %d, %s", repeat.label, repeat.round, config.compare.repeats,
                 f"{index + 1} of {len(todo)} to train")
        _train(repeat, paths, train_command, left=len(todo) - index, kept=len(kept))
        kept[repeat.label] = digests[repeat.name]
        _write_manifest(paths.out, kept)
    return todo


def _first_digest(first_reports: Path, name: str) -> str:
    path = first_reports / f"{name}.json"
    try:
        return report_digest(path)
    except FileNotFoundError:
        raise InputError(f"{path} not found: the repeats need round 1 first (dvc repro runs the train stages)") from None


def _outputs_of(paths: RepeatPaths, label: str) -> tuple[Path, Path, Path]:
    """A repeat's outputs, as the train stage writes them: its model folder, report and history."""
    return paths.models / label, paths.reports / f"{label}.json", paths.reports / "history" / f"{label}.csv"


def _train(repeat: Repeat, paths: RepeatPaths, train_command: Callable[..., list[str]], *, left: int, kept: int) -> None:
    """Run the train stage for one repeat as a child process; its failure is the stage's, named."""
    command = train_command(strategy=NORMAL_STRATEGY if repeat.name == NORMAL_RUN else repeat.name, name=repeat.label,
                            data=paths.data, models=paths.models, reports=paths.reports, backups=paths.backups)
    try:
        with ProcessGroup(out=sys.stderr, stop_timeout=STOP_SECONDS) as group:
            group.start(repeat.label, command, env={})
            group.wait()
    except RunError as err:
        detail = str(err).replace("; the other tasks were stopped", "")
        raise RunError(f"repeat {repeat.label} failed: {detail}\n{kept} finished repeat(s) kept; run the stage again "
                       f"to train the {left} left (dvc repro)") from None


def _read_manifest(folder: Path) -> dict[str, str]:
    """The finished repeats and the round-1 report digest each was made beside; empty where there is none yet."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}  # none, or a damaged one: every repeat is trained again (its outputs are replaced whole)
    return {str(label): str(digest) for label, digest in data.get("finished", {}).items()} if isinstance(data, dict) \
        else {}


def _write_manifest(folder: Path, finished: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic.write_json(folder / MANIFEST, {"finished": finished})


def _remove_unplanned(paths: RepeatPaths, labels: set[str]) -> None:
    """Remove the outputs of repeats no longer planned (rounds dropped, runs no longer listed)."""
    found = {path.stem for path in paths.reports.glob("*.json")}
    found |= {path.name for path in paths.models.iterdir() if path.is_dir()} if paths.models.is_dir() else set()
    for label in sorted(found - labels):
        if ".r" not in label:
            continue  # not a repeat's: left alone
        model, report, history = _outputs_of(paths, label)
        for path in (report, history):
            path.unlink(missing_ok=True)
        shutil.rmtree(model, ignore_errors=True)
        log.info("removed repeat %s: no longer planned", label)
