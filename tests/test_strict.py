"""The one strict loader of records (params.yaml's knobs, the stages' reports): every problem named by its key."""

from dataclasses import dataclass, field

import pytest

from tfdist.records.strict import build_record


class Refused(Exception):
    pass


@dataclass(frozen=True)
class Inner:
    rate: float = field(default=0.1, metadata={"gt": 0, "lt": 1})
    kind: str = field(default="a", metadata={"choices": ("a", "b")})


@dataclass(frozen=True)
class Outer:
    name: str
    sizes: list[int] = field(default_factory=list, metadata={"min_len": 1, "item_ge": 1})
    inner: Inner = field(default_factory=Inner)
    note: str | None = None
    uri: str = field(default="sqlite:///x.db", metadata={"secretless": True})


def build(raw):
    return build_record(Outer, raw, "", Refused)


def test_a_record_is_built_to_its_leaves_with_defaults():
    record = build({"name": "n", "sizes": [2, 3], "inner": {"rate": "2e-1"}})
    assert record == Outer("n", [2, 3], Inner(0.2, "a"), None), "YAML's 2e-1 (a string to it) read as the number"
    assert build({"name": "n", "sizes": [1], "note": None}).note is None


@pytest.mark.parametrize(("raw", "message"), [
    ({"name": "n", "sizse": [1]}, "unknown key sizse; did you mean sizes?"),
    ({"sizes": [1]}, "missing name"),
    ({"name": "n", "sizes": []}, "sizes must list at least 1 item(s)"),
    ({"name": "n", "sizes": [0]}, "sizes[0] must be >= 1; got 0"),
    ({"name": "n", "sizes": [True]}, "sizes[0] must be a whole number; got True (bool)"),
    ({"name": "n", "sizes": [1], "inner": {"rate": 1.5}}, "inner.rate must be < 1; got 1.5"),
    ({"name": "n", "sizes": [1], "inner": {"kind": "c"}}, "inner.kind must be one of a, b; got 'c'"),
    ({"name": "n", "sizes": [1], "inner": 3}, "inner must be a section of keys, got 3"),
    ({"name": False, "sizes": [1]}, "name must be a non-empty string; got False: YAML reads an unquoted on, off"),
])
def test_each_problem_is_one_line_naming_its_dotted_key(raw, message):
    with pytest.raises(Refused) as refused:
        build(raw)
    assert str(refused.value).startswith(message)


def test_a_password_in_a_secretless_field_is_refused_without_repeating_it():
    with pytest.raises(Refused) as refused:
        build({"name": "n", "sizes": [1], "uri": "postgresql://me:hunter2@db/mlflow"})
    assert str(refused.value).startswith("uri holds a password") and "hunter2" not in str(refused.value)
