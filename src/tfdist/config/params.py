"""params.yaml loaded strictly, with its ``--set`` overrides; the knobs under their dotted keys, and what each decides.

A typo fails loudly before training starts instead of being silently ignored:
an unknown key is refused with the closest known one, a wrong type or range
with the key named (:func:`tfdist.records.strict.build_record`).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tfdist.config.knobs import STAGES, Config, ConfigError
from tfdist.records.strict import build_record

#: A run name: it becomes a folder and file name (models/NAME, reports/train/NAME.json).
_RUN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


def load_config(path: Path | str = "params.yaml", overrides: typing.Sequence[str] = ()) -> Config:
    """Read ``params.yaml``, apply ``dotted.key=value`` overrides, validate.

    Args:
        path: the params file.
        overrides: ``--set`` items; values are parsed as YAML (``3`` is an int).

    Raises:
        ConfigError: the file is missing or not YAML, a key is unknown, or a value
            has the wrong type or is out of range. The message names the key.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"params file {path} not found; pass --params PATH") from None
    except OSError as err:
        raise ConfigError(f"cannot read params file {path}: {err.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path} is not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of keys, not {type(raw).__name__}")
    for item in overrides:
        _apply_override(raw, item)
    return build_record(Config, raw, "", ConfigError)


def parse_override(item: str) -> tuple[str, Any]:
    """Split ``a.b=value`` into the key and its YAML-typed value."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r} must look like dotted.key=value, e.g. train.epochs=3")
    try:
        return key, yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"--set {item!r}: value {value!r} is not valid YAML") from None


def _apply_override(raw: dict, item: str) -> None:
    key, value = parse_override(item)
    *parents, leaf = key.split(".")
    node = raw
    for depth, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {item!r}: {'.'.join(parents[: depth + 1])} is not a section")
        node = child
    node[leaf] = value


def _knob_metadata(kind: type = Config, prefix: str = "") -> dict[str, typing.Mapping[str, Any]]:
    """Every knob's dotted key and its field metadata (role, decides, rules), in params.yaml's order."""
    found: dict[str, typing.Mapping[str, Any]] = {}
    hints = typing.get_type_hints(kind)
    for f in dataclasses.fields(kind):
        if dataclasses.is_dataclass(hints[f.name]):
            found.update(_knob_metadata(hints[f.name], f"{prefix}{f.name}."))
        else:
            found[f"{prefix}{f.name}"] = f.metadata
    return found


def knob_roles() -> dict[str, str]:
    """``{"train.epochs": "result", ...}``: every knob's dotted key and role (:data:`ROLES`)."""
    return {key: metadata["role"] for key, metadata in _knob_metadata().items()}


def stage_params(stage: str) -> list[str]:
    """The dotted keys of the knobs that decide a kind of stage (:data:`STAGES`): its ``params:`` in dvc.yaml.

    Raises:
        ValueError: ``stage`` is not one of :data:`STAGES`.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown kind of stage {stage!r}; kinds are {', '.join(STAGES)}")
    return [key for key, metadata in _knob_metadata().items() if stage in metadata["decides"]]


def identifying_params(config: Config) -> dict[str, Any]:
    """The knobs that say which run this is: all but the ``operational`` ones (they change how, not what).

    A run's backup key and its pipeline execution's id hash these, so that
    e.g. turning on ``mlflow.register_models`` for the compare stage alone
    keeps it in the same execution as the training it compares.
    """
    roles = knob_roles()
    return {key: value for key, value in to_flat_dict(config).items() if roles[key] != "operational"}


def check_run_name(name: Any) -> str:
    """``name`` if it is a plain run name: letters, digits, ``_ . -``, not starting with a dot, at most 100 characters.

    A run name becomes a folder and file name (``models/NAME``, ``reports/train/NAME.json``,
    ``.tfdist/backups/NAME``), so anything that could leave those folders is refused.

    Raises:
        ConfigError: naming the value and the rule.
    """
    if not isinstance(name, str) or not _RUN_NAME.fullmatch(name):
        raise ConfigError(
            f"--name {name!r} is not a plain run name: use 1-100 letters, digits, '_', '.' or '-', "
            "not starting with '.', e.g. --name mirrored-bs256"
        )
    return name


def dotted_keys(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: a nested mapping (params.yaml as read) under dotted keys."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            flat.update(dotted_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def to_flat_dict(config: Config) -> dict[str, Any]:
    """``{"train.epochs": 10, ...}``: every knob under its dotted key, for logging."""
    return dotted_keys(dataclasses.asdict(config))
