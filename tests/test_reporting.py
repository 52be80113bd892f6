import pytest

from tfdist.errors import InputError
from tfdist.reporting import build_comparison, plot_figures, render_markdown


def train_report(strategy, seconds, replicas=1, devices=("/cpu:0",)):
    return {"strategy": strategy, "strategy_class": "X", "replicas": replicas, "devices": list(devices),
            "global_batch_size": 25 * replicas, "learning_rate": 0.001, "epochs": 2, "train_seconds": seconds,
            "samples_per_second": 1000 / seconds, "mlflow_run_id": f"id-{strategy}"}


def history():
    return [{"epoch": 1, "loss": 0.5, "val_loss": 0.6}, {"epoch": 2, "loss": 0.3, "val_loss": 0.4}]


def test_speedup_and_accuracy_delta_are_relative_to_normal():
    comparison = build_comparison(
        {"normal": train_report("default", 10.0), "mirrored": train_report("mirrored", 20.0, 2, ["/cpu:0", "/cpu:1"])},
        {"normal": {"accuracy": 0.95, "loss": 0.2}, "mirrored": {"accuracy": 0.94, "loss": 0.3}},
    )
    mirrored = comparison["runs"]["mirrored"]
    assert mirrored["speedup"] == pytest.approx(0.5)
    assert mirrored["accuracy_delta_points"] == pytest.approx(-1.0)
    assert list(comparison["runs"]) == ["normal", "mirrored"]
    assert comparison["verdict"].startswith("Distribution did not pay off on this hardware")
    assert "logical devices carved out of the same" in comparison["verdict"]


def test_a_real_speedup_is_called_one():
    comparison = build_comparison(
        {"normal": train_report("default", 10.0),
         "mirrored": train_report("mirrored", 4.0, 4, [f"/gpu:{i}" for i in range(4)])},
        {"normal": {"accuracy": 0.95, "loss": 0.2}, "mirrored": {"accuracy": 0.95, "loss": 0.2}},
    )
    assert comparison["verdict"].startswith("Distribution paid off: mirrored trained 2.50x as fast")
    assert "4 replicas on /gpu:0" in comparison["verdict"]


def test_comparison_needs_the_normal_run():
    with pytest.raises(InputError, match="needs the 'normal' run"):
        build_comparison({"mirrored": train_report("mirrored", 1.0)}, {"mirrored": {"accuracy": 1, "loss": 0}})


def test_markdown_and_figures(tmp_path):
    comparison = build_comparison(
        {"normal": train_report("default", 10.0), "central_storage": train_report("central_storage", 9.5, 2)},
        {"normal": {"accuracy": 0.95, "loss": 0.2}, "central_storage": {"accuracy": 0.951, "loss": 0.2}},
    )
    markdown = render_markdown(comparison)
    row = ("| central_storage | central_storage | fit | float32 | sync | 2 | 1 | 50 | 0.001 | 105 | 4.750 | 0.00 | 9.5 "
           "| 1.05x | 0.9510 | +0.10 |")
    assert row in markdown
    assert "Asynchronous" not in markdown
    assert "did not pay off: the fastest strategy, central_storage, ran within 10%" in markdown
    paths = plot_figures(comparison, {"normal": history(), "central_storage": history()}, tmp_path / "figures")
    assert [p.name for p in paths] == ["throughput.png", "accuracy_vs_time.png", "loss_curves.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)


def test_multi_process_runs_show_processes_and_parameter_server_is_called_asynchronous():
    ps = {**train_report("parameter_server", 30.0, 1, ["/job:worker/task:0", "/job:worker/task:1"]),
          "workers": 2, "ps": 1, "synchronous": False, "loop": "custom", "precision": "mixed_bfloat16",
          "precision_can_be_faster": False}
    mwms = {**train_report("multi_worker_mirrored", 25.0, 2, ["/job:worker/task:0", "/job:worker/task:1"]),
            "workers": 2, "ps": 0, "synchronous": True, "learning_rate": 0.002}
    comparison = build_comparison(
        {"normal": train_report("default", 10.0), "parameter_server": ps, "multi_worker_mirrored": mwms},
        {name: {"accuracy": 0.95, "loss": 0.2} for name in ("normal", "parameter_server", "multi_worker_mirrored")},
    )
    markdown = render_markdown(comparison)
    assert "| parameter_server | parameter_server | custom | mixed_bfloat16 | async | 1 | 2 + 1 | 25 | 0.001 |" in markdown
    assert "| multi_worker_mirrored | multi_worker_mirrored | fit | float32 | sync | 2 | 2 | 50 | 0.002 |" in markdown
    assert "**Asynchronous:** parameter_server trained with parameter servers" in markdown
    assert "Its 2 worker processes shared the same" in comparison["verdict"]
    assert "**Precision:** this machine has no hardware that computes mixed_bfloat16 faster" in markdown


def test_speedup_compares_steady_state_so_warm_up_is_shown_apart():
    normal = {**train_report("default", 3.0), "epochs": 10, "steady_epoch_seconds": 0.1,
              "first_epoch_overhead_seconds": 0.9, "steady_samples_per_second": 36000}
    mirrored = {**train_report("mirrored", 4.0, 2, ["/gpu:0", "/gpu:1"]), "epochs": 10, "steady_epoch_seconds": 0.05,
                "first_epoch_overhead_seconds": 2.5, "steady_samples_per_second": 72000}
    comparison = build_comparison({"normal": normal, "mirrored": mirrored},
                                  {"normal": {"accuracy": 0.95, "loss": 0.2}, "mirrored": {"accuracy": 0.95, "loss": 0.2}})
    row = comparison["runs"]["mirrored"]
    assert row["speedup"] == pytest.approx(2.0) and row["wall_speedup"] == pytest.approx(0.75)
    assert comparison["verdict"].startswith("Distribution paid off: mirrored trained 2.00x as fast")
    assert "0.050 s vs 0.100 s per epoch at steady state" in comparison["verdict"]
    assert "| 72,000 | 0.050 | 2.50 | 4.0 | 2.00x |" in render_markdown(comparison)
