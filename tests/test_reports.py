"""The typed reports: what the train stage writes is what every reader gets, and nothing else is accepted."""

import json

import pytest

from tfdist.errors import InputError
from tfdist.hardware import describe
from tfdist.records.reports import EvalReport, TrainReport, read_report, to_dict, write_report

from helpers.reports import train_report


def test_a_report_written_is_read_back_equal(tmp_path):
    report = train_report("mirrored", 4.0, 2, ["/cpu:0", "/cpu:1"], startup_seconds=None)
    write_report(tmp_path / "mirrored.json", report)
    assert read_report(tmp_path / "mirrored.json", TrainReport) == report
    assert json.loads((tmp_path / "mirrored.json").read_text())["hardware"]["cpu_cores"] == 2


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("steady_epoch_seconds"), ": missing steady_epoch_seconds; rerun"),
    (lambda d: d.update(host="vm"), ": unknown key host; rerun"),
    (lambda d: d.update(replica=2), ": unknown key replica; did you mean replicas?"),
    (lambda d: d.update(replicas="2"), ": replicas must be a whole number; got '2' (str)"),
    (lambda d: d["hardware"].pop("hosts"), ": missing hardware.hosts; rerun"),
    (lambda d: d["precision_support"]["mixed_float16"].update(can_be_faster="yes"),
     ": precision_support.mixed_float16.can_be_faster must be true or false; got 'yes'"),
])
def test_a_report_off_the_schema_is_refused_naming_the_field(tmp_path, change, message):
    data = to_dict(train_report("mirrored", 4.0))
    change(data)
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="rerun the stage that writes it") as raised:
        read_report(tmp_path / "r.json", TrainReport)
    assert message in str(raised.value) and str(tmp_path / "r.json") in str(raised.value)


def test_missing_and_broken_reports_name_the_file(tmp_path):
    with pytest.raises(InputError, match="nope.json not found; run the stages that write it"):
        read_report(tmp_path / "nope.json", EvalReport)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InputError, match="bad.json is not valid JSON"):
        read_report(tmp_path / "bad.json", EvalReport)


def test_loopback_cluster_hosts_are_this_machine(monkeypatch):
    monkeypatch.setattr("platform.node", lambda: "laptop")
    assert describe(["CPU"], [], ["127.0.0.1", "localhost"]).hosts == ["laptop"]
    assert describe(["CPU"], [], None).shared_cpu
    two = describe(["GPU"], ["A100"], ["10.0.0.1", "10.0.0.2"])
    assert two.hosts == ["10.0.0.1", "10.0.0.2"] and not two.shared_cpu
