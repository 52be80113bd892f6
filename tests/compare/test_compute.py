"""The comparison's numbers and words: speed-ups against normal training, the verdict, the advice, the projection."""

import pytest

from tfdist.compare.comparison import Network
from tfdist.compare.compute import build_comparison, time_to_accuracy
from tfdist.compare.render import render_markdown
from tfdist.config.knobs import CompareConfig
from tfdist.errors import InputError
from tfdist.hardware import Hardware
from tfdist.records.reports import CollectiveCosts, ThreadSettings
from tfdist.records.run_names import run_label

from helpers.reports import eval_report, scaled_runs, train_report


def test_speedup_and_accuracy_delta_are_relative_to_normal():
    comparison = build_comparison(
        {"normal": train_report("default", 10.0), "mirrored": train_report("mirrored", 20.0, 2, ["/cpu:0", "/cpu:1"])},
        {"normal": eval_report("normal", 0.95, 0.2), "mirrored": eval_report("mirrored", 0.94, 0.3)},
    )
    mirrored = comparison.runs["mirrored"]
    assert mirrored.speedup == pytest.approx(0.5)
    assert mirrored.accuracy_delta_points == pytest.approx(-1.0)
    assert list(comparison.runs) == ["normal", "mirrored"]
    assert comparison.verdict.startswith("Distribution did not pay off on this hardware")
    assert "logical devices carved out of the same" in comparison.verdict


def test_a_real_speedup_is_called_one():
    comparison = build_comparison(
        {"normal": train_report("default", 10.0),
         "mirrored": train_report("mirrored", 4.0, 4, [f"/gpu:{i}" for i in range(4)])},
        {"normal": eval_report("normal", 0.95, 0.2), "mirrored": eval_report("mirrored", 0.95, 0.2)},
    )
    assert comparison.verdict.startswith("Distribution paid off: mirrored trained 2.50x as fast")
    assert "4 replicas on /gpu:0" in comparison.verdict


def test_workers_that_beat_normal_training_on_its_own_cores_are_said_to_use_them_better_not_to_add_any():
    """The convnet at batch 25 on 2 cores: 2 pinned workers 1.7x normal training's 2 threads per op (measured)."""
    mwms = train_report("multi_worker_mirrored", 5.9, 2, ["/job:worker/task:0", "/job:worker/task:1"], workers=2,
                        threads=ThreadSettings(1, 1, 1))
    comparison = build_comparison(
        {"normal": train_report("default", 10.0, threads=ThreadSettings(2, 2, 2)), "multi_worker_mirrored": mwms},
        {name: eval_report(name, 0.97, 0.1) for name in ("normal", "multi_worker_mirrored")})
    assert comparison.verdict.startswith("Distribution paid off: multi_worker_mirrored trained 1.69x as fast")
    assert ("Its 2 worker processes shared the same 2 CPU cores of one machine (2 x 1 CPU, 1 thread per op) as "
            "normal training (2 CPUs, 2 threads per op): each computed its own batch on its own core") in comparison.verdict
    assert "add no compute" not in comparison.verdict


def test_comparison_needs_the_normal_run():
    with pytest.raises(InputError, match="needs the 'normal' run"):
        build_comparison({"mirrored": train_report("mirrored", 1.0)}, {"mirrored": eval_report("mirrored", 1, 0)})


def test_multi_process_runs_show_processes_and_parameter_server_is_called_asynchronous():
    ps = train_report("parameter_server", 30.0, 1, ["/job:worker/task:0", "/job:worker/task:1"], workers=2, ps=1,
                      synchronous=False, loop="custom", precision="mixed_bfloat16",
                      precision_can_be_faster=False)
    mwms = train_report("multi_worker_mirrored", 25.0, 2, ["/job:worker/task:0", "/job:worker/task:1"], workers=2, ps=0,
                        synchronous=True, learning_rate=0.002)
    comparison = build_comparison(
        {"normal": train_report("default", 10.0), "parameter_server": ps, "multi_worker_mirrored": mwms},
        {name: eval_report(name, 0.95, 0.2) for name in ("normal", "parameter_server", "multi_worker_mirrored")},
    )
    markdown = render_markdown(comparison)
    assert ("| parameter_server | parameter_server | custom | mixed_bfloat16 | async | 1 | 25 | 0.001 | 2 + 1 "
            "| 2 CPUs, 1 thread per op |") in markdown
    assert ("| multi_worker_mirrored | multi_worker_mirrored | fit | float32 | sync | 2 | 50 | 0.002 | 2 "
            "| 2 x 2 CPUs, 1 thread per op |") in markdown
    assert "**Asynchronous:** parameter_server trained with parameter servers" in markdown
    assert "Its 2 worker processes shared the same" in comparison.verdict
    assert "**Precision:** this machine has no hardware that computes mixed_bfloat16 faster" in markdown


def test_speedup_compares_steady_state_so_warm_up_is_shown_apart():
    normal = train_report("default", 3.0, epochs=10, steady_epoch_seconds=0.1,
              first_epoch_overhead_seconds=0.9, steady_samples_per_second=36000)
    mirrored = train_report("mirrored", 4.0, 2, ["/gpu:0", "/gpu:1"], epochs=10, steady_epoch_seconds=0.05,
                first_epoch_overhead_seconds=2.5, steady_samples_per_second=72000)
    comparison = build_comparison({"normal": normal, "mirrored": mirrored},
                                  {"normal": eval_report("normal", 0.95, 0.2), "mirrored": eval_report("mirrored", 0.95, 0.2)})
    row = comparison.runs["mirrored"]
    assert row.speedup == pytest.approx(2.0) and row.vs_normal["wall_speedup"] == pytest.approx(0.75)
    assert comparison.verdict.startswith("Distribution paid off: mirrored trained 2.00x as fast")
    assert "0.050 s vs 0.100 s per epoch at steady state" in comparison.verdict
    assert "| mirrored | 72,000 | 0.050 | 2.00x | 2.50 | 4.0 | 90% |" in render_markdown(comparison)


def test_run_labels_say_what_differs():
    one = {"replicas": 1, "workers": 1, "ps": 0, "loop": "fit", "precision": "float32"}
    assert run_label("mirrored", strategy="mirrored", **{**one, "replicas": 2}) == "mirrored ×2 · fit · float32"
    assert run_label("normal", strategy="default", **{**one, "loop": "custom", "precision": "mixed_bfloat16"},
                     distributes=False) == "normal · custom · mixed_bfloat16"
    assert run_label("parameter_server", strategy="parameter_server", **{**one, "workers": 2, "ps": 1},
                     clip="global_norm") == "parameter_server 2w+1ps · fit · float32 · clip global_norm"
    assert run_label("big", strategy="mirrored", **{**one, "replicas": 4}) == "big (mirrored ×4) · fit · float32"
    assert run_label("try", strategy="default", **one, distributes=False) == "try · fit · float32"


def calibrated_mwms(samples_per_second: float, latency: float = 1e-3, per_byte: float = 2e-9,
                    size: int = 400_000, compute: float | None = None, **fields):
    """multi_worker_mirrored x2 (batch 25 each) with its all-reduce calibrated between the workers (and its step
    timed alone: ``compute`` seconds)."""
    costs = CollectiveCosts(workers=2, small_bytes=4, small_seconds=latency, large_bytes=size,
                            large_seconds=latency + per_byte * size, latency_seconds=latency, seconds_per_byte=per_byte,
                            compute_seconds=compute)
    return train_report("multi_worker_mirrored", 20.0, 2, ["/job:worker/task:0", "/job:worker/task:1"], workers=2,
                        steady_samples_per_second=samples_per_second, collectives=costs, **fields)


def projected(normal_sps: float, mwms, network: CompareConfig | None = None) -> dict:
    runs = {"normal": train_report("default", 10.0, steady_samples_per_second=normal_sps), "multi_worker_mirrored": mwms,
            "mirrored": train_report("mirrored", 10.0, 2, ["/cpu:0", "/cpu:1"], steady_samples_per_second=900.0)}
    return build_comparison(runs, {name: eval_report(name, 0.95) for name in runs}, settings=network)


def test_the_projection_is_the_measured_compute_plus_a_ring_all_reduce_on_the_named_network():
    # a 50-example step in 10 ms, of which the all-reduce here took 1 ms + 400,000 x 2 ns = 1.8 ms
    comparison = projected(1000.0, calibrated_mwms(5000.0), CompareConfig(network_gbit=1.0, network_latency_us=100.0))
    (p,) = comparison.scaling
    assert p.name == "multi_worker_mirrored" and p.normal_step_ms == pytest.approx(25.0)
    assert (p.step_ms, p.all_reduce_here_ms, p.compute_ms) == pytest.approx((10.0, 1.8, 8.2))
    # 2 machines: 2 messages of 0.5 ms + 0.1 ms, and 400,000 bytes at 2 ns + 8 ns (1 Gbit/s) each
    assert p.step_on_network_ms["2"] == pytest.approx(8.2 + 1.2 + 4.0)
    # 4 machines: 6 messages, and 2 x 3/4 of the bytes
    assert p.step_on_network_ms["4"] == pytest.approx(8.2 + 3.6 + 6.0)
    assert p.projected_speedup["4"] == pytest.approx(4 * 25 / 17.8)
    assert p.break_even_machines == 2
    assert p.ceiling_speedup == pytest.approx(25 / 1.2), "2 messages of 0.6 ms a machine"
    assert p.ceiling_speedup > p.projected_speedup["16"]
    assert comparison.network == Network(gbit=1.0, latency_us=100.0)
    advice = comparison.advice.scale
    assert "8.20 ms of compute (its measured 10.00 ms a step, less the 1.80 ms its all-reduce of 391 KiB" in advice
    assert "on a 1 Gbit/s network with 100 µs latency (`compare.network_gbit`, `compare.network_latency_us`)" in advice
    assert "The projection was checked against runs on 2 and 4 emulated machines" in advice
    assert "beyond 4 machines, and on a real network, it is unchecked" in advice
    assert "Not projected: mirrored (one machine's devices" in advice


def test_a_compute_timed_alone_splits_the_rest_of_the_step_into_compute_and_overhead():
    # the same 10 ms step of which the all-reduce took 1.8 ms; one replica's step alone took 5 ms
    comparison = projected(1000.0, calibrated_mwms(5000.0, compute=0.005),
                           CompareConfig(network_gbit=1.0, network_latency_us=100.0))
    (p,) = comparison.scaling
    assert (p.compute_ms, p.overhead_ms) == pytest.approx((5.0, 3.2))
    assert p.step_on_network_ms["2"] == pytest.approx(5.0 + 3.2 + 1.2 + 4.0), "the overhead is paid on every machine"
    assert ("5.00 ms of compute and 3.20 ms of the strategy's own overhead (its measured 10.00 ms a step, less the "
            "1.80 ms its all-reduce") in comparison.advice.scale
    assert "| multi_worker_mirrored | 10.00 | 1.80 | 5.00 | 3.20 |" in render_markdown(comparison)
    assert "On 2 machines the all-reduce would be 39% of its step" in comparison.advice.scale, \
        "the wire's share: what is neither compute nor overhead, 5.2 of 13.4 ms"


@pytest.mark.parametrize(("sps", "sent", "says"), [
    (5000.0, "none", "On 2 machines the all-reduce would be 39% of its step: sending the gradients in 16 bits halves its "
                     "bytes (`dvc exp run -S 'distributed.strategies=[multi_worker_mirrored]' -S "
                     "distributed.gradient_compression=bfloat16`"),
    (5000.0, "bfloat16", "Its gradients crossed the wire as bfloat16 (`distributed.gradient_compression`)"),
    (500.0, "none", None),  # a 100 ms step: 5 ms of wire is 5% of it, not worth the rounding
])
def test_the_advice_suggests_16_bit_gradients_where_the_wire_is_much_of_the_projected_step(sps, sent, says):
    comparison = projected(1000.0, calibrated_mwms(sps, gradient_compression=sent),
                           CompareConfig(network_gbit=1.0, network_latency_us=100.0))
    if says:
        assert says in comparison.advice.scale
    else:
        assert "gradient_compression" not in comparison.advice.scale


def test_a_step_cheaper_than_the_latency_never_breaks_even_and_the_advice_says_what_caps_it():
    # normal takes 25 examples in 0.25 ms; every machine adds 2 messages of 0.5 + 0.05 ms to each step
    comparison = projected(100_000.0, calibrated_mwms(20_000.0))
    (p,) = comparison.scaling
    assert p.break_even_machines is None and p.ceiling_speedup == pytest.approx(0.25 / 1.1)
    assert p.projected_speedup["2"] < p.projected_speedup["16"] < p.ceiling_speedup
    assert "never matches normal training's 0.25 ms step" in comparison.advice.scale
    assert "which caps it at 0.23x normal speed" in comparison.advice.scale
    assert "| multi_worker_mirrored |" in render_markdown(comparison) and " never |" in render_markdown(comparison)


def test_without_an_all_reduce_across_workers_nothing_is_projected():
    advice = scaled_runs(mirrored_sps=800.0)
    assert advice.scaling == []
    assert advice.advice.scale.startswith("No run all-reduced across workers")
    assert advice.advice.scale.endswith(
        "Not projected: mirrored (one machine's devices); parameter_server (its pulls and pushes to the parameter "
        "servers are not modelled).")


def test_advice_says_to_train_without_distribution_when_nothing_is_faster():
    advice = scaled_runs(mirrored_sps=800.0).advice
    assert advice.use.startswith("Train without distribution on this machine")
    assert "the closest, mirrored, ran at 0.80x" in advice.use
    assert advice.precision.startswith("mixed_bfloat16 can pay off here (the CPU has avx512_bf16)")
    assert "dvc exp run -S train.precision=mixed_bfloat16" in advice.precision


def test_advice_names_a_faster_strategy_and_its_accuracy_cost():
    advice = scaled_runs(mirrored_sps=3000.0, accuracy=0.92).advice
    assert advice.use.startswith("Use mirrored: it trained 3.00x as fast as normal training")
    assert "test accuracy -3.0 points" in advice.use and "train.lr_scaling: linear" in advice.use


def test_precision_advice_without_fast_hardware_says_where_it_pays():
    runs = {"normal": train_report("default", 10.0, precision="mixed_float16", precision_support={
        "mixed_bfloat16": {"can_be_faster": False, "reason": "no AVX512-BF16"},
        "mixed_float16": {"can_be_faster": False, "reason": "no GPU"}})}
    text = build_comparison(runs, {"normal": eval_report("normal", 0.9, 0.3)}).advice.precision
    assert text.startswith("These runs used mixed_float16, which no unit here computes faster than float32")
    assert "Mixed precision would not pay off on this machine: no GPU; no AVX512-BF16." in text
    assert "is emulated, which costs more than it saves" in text, "as measured: docs/performance.md section 4"


def test_the_verdict_reasons_from_the_hardware_where_training_ran_not_where_compare_runs():
    cluster = Hardware(["gpu-node-1", "gpu-node-2"], 64, "Xeon", ["GPU"], ["NVIDIA A100"])
    mwms = train_report("multi_worker_mirrored", 5.0, 8, [f"/job:worker/task:{i}" for i in range(2)], workers=2,
                        hardware=cluster)
    comparison = build_comparison({"normal": train_report("default", 10.0), "multi_worker_mirrored": mwms},
                                  {name: eval_report(name, 0.95) for name in ("normal", "multi_worker_mirrored")})
    assert "shared" not in comparison.verdict
    assert "It ran 2 workers on 2 machines (gpu-node-1, gpu-node-2), 8 replicas in all" in comparison.verdict
    assert comparison.runs["multi_worker_mirrored"].report.hardware.hosts == ["gpu-node-1", "gpu-node-2"]

    local = train_report("multi_worker_mirrored", 20.0, 2, ["/job:worker/task:0", "/job:worker/task:1"], workers=2,
                         hardware=Hardware(["laptop"], 12, "i7", ["CPU"], []))
    comparison = build_comparison({"normal": train_report("default", 10.0), "multi_worker_mirrored": local},
                                  {name: eval_report(name, 0.95) for name in ("normal", "multi_worker_mirrored")})
    assert "Its 2 worker processes shared the same 12 CPU cores of one machine" in comparison.verdict


def test_the_report_says_which_machine_measured_it():
    normal = train_report("default", 10.0, hardware=Hardware(["ci-runner"], 2, "AMD EPYC", ["CPU"], []))
    comparison = build_comparison({"normal": normal}, {"normal": eval_report("normal", 0.95)})
    line = ("*Measured on ci-runner (AMD EPYC, 2 cores, no GPU); the numbers are that machine's: "
            "run `dvc repro` to measure yours.*")
    assert line in render_markdown(comparison).splitlines()


def test_the_three_paradigms_side_by_side_with_what_each_holds_moves_and_idles():
    split = {"devices": ["/cpu:0", "/cpu:1"], "params_per_device": [100_480, 1_290], "bytes_per_step": 25_600,
             "stages": 2}
    comparison = build_comparison(
        {"normal": train_report("default", 10.0),
         "mirrored": train_report("mirrored", 12.0, 2, ["/cpu:0", "/cpu:1"], params_per_device=[101_770] * 2,
                                  bytes_per_step=814_160),
         "model_parallel": train_report("model_parallel", 11.0, paradigm="model", bubble=0.22, bubble_theory=0.5, **split),
         "pipeline_parallel": train_report("pipeline_parallel", 14.0, paradigm="pipeline", micro_batches=5,
                                           bubble=0.38, bubble_theory=1 / 6, **split)},
        {name: eval_report(name, 0.95) for name in ("normal", "mirrored", "model_parallel", "pipeline_parallel")},
    )
    markdown = render_markdown(comparison)
    assert "| model_parallel | model | 100,480 | 25,600 | 1 | 22% | 50% |" in markdown
    assert "| pipeline_parallel | pipeline | 100,480 | 25,600 | 5 | 38% | 17% |" in markdown
    assert "| mirrored | data | 101,770 | 814,160 | 1 | – | – |" in markdown
    advice = comparison.advice.paradigms
    assert "model_parallel held at most 100,480 parameters on a device and moved 25 KiB of activations per step" in advice
    assert "idled 38% of a step (theory 17% for 2 stages and 5 micro-batches)" in advice
    assert "kept all 101,770 parameters on every replica and moved 795 KiB per step" in advice
    assert comparison.scaling == [], "a layer split is not projected as replicas (nor one machine's mirrored)"


def history(val_accuracies, epoch_seconds=1.0, first_epoch_seconds=None):
    """A train stage's per-epoch rows: the validation accuracies given, each epoch taking ``epoch_seconds``."""
    return [{"epoch": float(i + 1), "val_accuracy": acc, "loss": 0.5, "accuracy": acc, "val_loss": 0.5,
             "epoch_seconds": first_epoch_seconds if i == 0 and first_epoch_seconds else epoch_seconds,
             "samples_per_second": 1000.0} for i, acc in enumerate(val_accuracies)]


def test_time_to_accuracy_adds_the_epochs_until_validation_first_reaches_the_target():
    rows = history([0.80, 0.91, 0.89, 0.95], epoch_seconds=0.5, first_epoch_seconds=2.0)
    assert time_to_accuracy(rows, 0.90) == (2, pytest.approx(2.5))
    assert time_to_accuracy(rows, 0.95) == (4, pytest.approx(3.5))  # the dip at epoch 3 does not end it
    assert time_to_accuracy(rows, 0.96) is None
    assert time_to_accuracy([], 0.5) is None


def test_a_run_faster_per_sample_that_needs_more_epochs_is_slower_to_accuracy_and_the_verdict_says_so():
    # mirrored is 2x normal's throughput (half the seconds an epoch) but needs 5 epochs where normal needs 2
    normal = train_report("default", 10.0, epochs=6, steady_epoch_seconds=1.0)
    mirrored = train_report("mirrored", 5.0, 2, ["/gpu:0", "/gpu:1"], epochs=6, steady_epoch_seconds=0.5)
    ps = train_report("parameter_server", 12.0, 1, ["/job:worker/task:0"], workers=2, ps=1, synchronous=False,
                      epochs=6, steady_epoch_seconds=2.0)
    histories = {"normal": history([0.90, 0.94, 0.95, 0.95, 0.96, 0.96], 1.0),
                 "mirrored": history([0.80, 0.85, 0.88, 0.91, 0.935, 0.94], 0.5),
                 "parameter_server": history([0.85, 0.88, 0.90, 0.90, 0.91, 0.92], 2.0)}
    comparison = build_comparison({"normal": normal, "mirrored": mirrored, "parameter_server": ps},
                                  {name: eval_report(name, 0.95) for name in histories}, histories,
                                  CompareConfig(target_accuracy=0.93))
    runs = comparison.runs
    assert (runs["normal"].epochs_to_target, runs["normal"].seconds_to_target) == (2, pytest.approx(2.0))
    assert (runs["mirrored"].epochs_to_target, runs["mirrored"].seconds_to_target) == (5, pytest.approx(2.5))
    assert runs["mirrored"].speedup == pytest.approx(2.0)
    assert runs["mirrored"].time_to_accuracy_speedup == pytest.approx(0.8)
    assert runs["parameter_server"].seconds_to_target is None
    assert runs["parameter_server"].time_to_accuracy_speedup is None
    # every epoch alike: the steady epochs leave no spread; the epochs that reached the target, a wide one
    assert comparison.verdict.startswith("Distribution paid off: mirrored trained 2.00x (2.00x-2.00x, steady epochs "
                                         "within one run) as fast")
    assert ("To 0.93 validation accuracy, mirrored took 5 epochs and 2.5 s against normal training's 2 and 2.0 s "
            "(0.80x (0.40x-1.00x, the epoch each run reached the target in) in time to accuracy, within noise).") \
        in comparison.verdict
    markdown = render_markdown(comparison)
    assert "epochs to target | time to target (s) | speed-up to target" in markdown
    assert "| mirrored | " in markdown and "| 5 | 2.5 | 0.80x (0.40-1.00) |" in markdown
    assert "| not reached | not reached | not reached |" in markdown
    assert "until validation accuracy first reached 0.93 (`compare.target_accuracy`)" in markdown


def test_time_to_accuracy_is_left_out_of_the_verdict_where_it_agrees_with_throughput():
    normal = train_report("default", 10.0, epochs=6, steady_epoch_seconds=1.0)
    mirrored = train_report("mirrored", 5.0, 2, ["/gpu:0", "/gpu:1"], epochs=6, steady_epoch_seconds=0.5)
    # both reach the target in epoch 5, so its resolution (which epoch) still tells them apart: 1.6x-2.5x
    accuracy = [0.80, 0.85, 0.88, 0.91, 0.94, 0.95]
    histories = {"normal": history(accuracy, 1.0), "mirrored": history(accuracy, 0.5)}
    comparison = build_comparison({"normal": normal, "mirrored": mirrored},
                                  {name: eval_report(name, 0.95) for name in histories}, histories,
                                  CompareConfig(target_accuracy=0.93))
    assert comparison.runs["mirrored"].time_to_accuracy_speedup == pytest.approx(2.0)
    assert "validation accuracy" not in comparison.verdict


def two_epochs_to_093(normal_val, mirrored_val, test_accuracy, **fields):
    """Normal training and mirrored (twice as fast), 2 epochs each at these validation accuracies, target 0.93."""
    normal = train_report("default", 10.0, epochs=2, steady_epoch_seconds=1.0, **fields)
    mirrored = train_report("mirrored", 5.0, 2, ["/gpu:0", "/gpu:1"], epochs=2, steady_epoch_seconds=0.5, **fields)
    histories = {"normal": history(normal_val, 1.0), "mirrored": history(mirrored_val, 0.5)}
    return build_comparison({"normal": normal, "mirrored": mirrored},
                            {name: eval_report(name, test_accuracy) for name in histories}, histories,
                            CompareConfig(target_accuracy=0.93))


def test_a_distributed_run_that_never_reaches_the_target_is_named_in_the_verdict():
    comparison = two_epochs_to_093([0.90, 0.94], [0.85, 0.90], 0.95)
    assert ("But mirrored never reached 0.93 validation accuracy in its 2 epochs, which normal training did in 2 "
            "(2.0 s of training).") in comparison.verdict


def compute_heavy_comparison():
    """A convnet-like run: multi_worker_mirrored's step mostly compute, so more machines pay where one does not.

    normal: 25 examples in 25 ms; multi_worker_mirrored x2 here: 50 examples in 52.6 ms (the workers share the
    cores), 1.8 ms of it the all-reduce. Both reach 0.93 in 3 epochs; normal in 30 s of training.
    """
    runs = {"normal": train_report("default", 10.0, steady_samples_per_second=1000.0),
            "multi_worker_mirrored": calibrated_mwms(950.0)}
    histories = {name: history([0.90, 0.92, 0.94], epoch_seconds=10.0) for name in runs}
    return build_comparison(runs, {name: eval_report(name, 0.95) for name in runs}, histories,
                            CompareConfig(network_gbit=1.0, network_latency_us=100.0, target_accuracy=0.93))


def test_where_more_machines_pay_the_verdict_and_the_advice_say_yes_with_how_many_and_what_it_gains():
    comparison = compute_heavy_comparison()
    (p,) = comparison.scaling
    assert p.break_even_machines == 3 and p.projected_speedup["4"] == pytest.approx(1.65, abs=0.01)
    yes = ("Across machines it pays: multi_worker_mirrored on 4 machines of a 1 Gbit/s network (100 µs latency) is "
           "projected at 1.65x normal training's speed (breaking even at 3 machines, 5.24x with 16), and to 0.93 "
           "validation accuracy in about 18.1 s of training against normal training's 30.0 s.")
    assert comparison.verdict.startswith("Distribution did not pay off on this hardware") and comparison.verdict.endswith(yes)
    assert comparison.advice.use.startswith("Train without distribution on this machine")
    assert comparison.advice.use.endswith(yes)


def test_where_no_machine_count_pays_nothing_is_promised():
    comparison = projected(100_000.0, calibrated_mwms(20_000.0))
    assert "Across machines" not in comparison.verdict and "Across machines" not in comparison.advice.use


def test_the_compare_stage_says_yes_where_more_machines_pay(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from stages import compare
    from tfdist.records.history import write_history
    from tfdist.records.reports import write_report

    from helpers.project import tiny_params

    monkeypatch.chdir(tmp_path)
    tiny_params(tmp_path, distributed={"strategies": ["multi_worker_mirrored"]},
                compare={"network_gbit": 1.0, "network_latency_us": 100.0, "target_accuracy": 0.93})
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    mlflow.set_experiment("tests")
    ids = {}
    for name in ("normal", "multi_worker_mirrored"):  # the training runs the comparison is attached to
        with mlflow.start_run(run_name=name) as run:
            ids[name] = run.info.run_id
    runs = {"normal": train_report("default", 10.0, steady_samples_per_second=1000.0, mlflow_run_id=ids["normal"]),
            "multi_worker_mirrored": calibrated_mwms(950.0, mlflow_run_id=ids["multi_worker_mirrored"])}
    for name, report in runs.items():
        write_report(tmp_path / "reports" / "train" / f"{name}.json", report)
        write_history(tmp_path / "reports" / "train" / "history" / f"{name}.csv", history([0.90, 0.92, 0.94], 10.0))
        write_report(tmp_path / "reports" / "eval" / f"{name}.json", eval_report(name, 0.95))
    result = CliRunner().invoke(compare.main, [])
    assert result.exit_code == 0, result.output
    said = ("Across machines it pays: multi_worker_mirrored on 4 machines of a 1 Gbit/s network (100 µs latency) is "
            "projected at 1.65x normal training's speed")
    assert said in result.output
    assert said in (tmp_path / "reports" / "compare" / "compare.md").read_text()


def test_a_target_no_run_reaches_is_said_and_the_report_is_still_written():
    # the user's own data, with MNIST's default target: nobody gets there
    comparison = two_epochs_to_093([0.60, 0.70], [0.55, 0.68], 0.7, dataset="parts (16x16x3, 3 classes)")
    assert ("No run reached 0.93 validation accuracy (`compare.target_accuracy`) in its 2 epochs, so time to accuracy "
            "was not measured: set the target to one this data reaches, or train longer.") in comparison.verdict
    markdown = render_markdown(comparison)
    assert markdown.startswith("# Normal vs distributed training on parts (16x16x3, 3 classes)\n")
    assert "| not reached | not reached | not reached |" in markdown


@pytest.mark.parametrize("shares, says", [
    ((0.40, None), "Input-bound: normal waited between its steps for the next batch for 25% or more of its training "
                   "time (normal 40%): the input's making and its hand-over"),
    ((0.05, None), "No run waited for its input for 25% of its training time or more (normal 5%): "
                   "the steps set the pace."),
    ((None, None), "Not timed: the steps' wait for their input is measured in normal training"),
])
def test_the_advice_says_which_run_waited_for_its_input_and_what_to_turn(shares, says):
    runs = {"normal": train_report("default", 10.0, input_share=shares[0]),
            "mirrored": train_report("mirrored", 8.0, replicas=2, input_share=shares[1])}
    comparison = build_comparison(runs, {name: eval_report(name, 0.9, 0.3) for name in runs})
    assert comparison.advice.input.startswith(says)
    assert f"**Input:** {says}" in render_markdown(comparison)
    if shares[0] == 0.40:
        assert "more shards of the prepared data" in comparison.advice.input
