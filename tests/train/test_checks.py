"""What the train stage refuses at start: a precision or a cluster a strategy cannot train with."""

import pytest

from tfdist.distribute.cluster_spec import ClusterError, ClusterTask, check_cluster
from tfdist.distribute.registry import REGISTRY, StrategyError, get_spec
from tfdist.train.checks import check_precision


@pytest.mark.parametrize(("precision", "refused"), [("mixed_float16", ["central_storage", "parameter_server", "tpu"]),
                                                    ("mixed_bfloat16", []), ("float32", [])])
def test_loss_scaling_decides_where_mixed_float16_is_refused(precision, refused):
    for name, spec in REGISTRY.items():
        if name in refused:
            with pytest.raises(StrategyError, match=f"mixed_float16 needs loss scaling, .* not {name}; use mixed_bfloat16"):
                check_precision(spec, precision)
        else:
            check_precision(spec, precision)


@pytest.mark.parametrize(("cluster", "strategy", "message"), [
    ({"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]}, "multi_worker_mirrored",
     "takes no 'ps' job"),
    ({"worker": ["a:1"], "ps": ["p:1"]}, "parameter_server", "missing chief"),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "parameter_server", "missing ps"),
    ({"worker": ["a:1"], "evaluator": ["e:1"]}, "multi_worker_mirrored", "'evaluator' is not supported"),
    ({"chief": ["c:1", "d:1"], "worker": ["a:1"]}, "multi_worker_mirrored", "cluster.chief must list one task"),
])
def test_a_cluster_that_does_not_fit_the_strategy_is_refused(cluster, strategy, message):
    task = ClusterTask(cluster, "worker", 0)
    with pytest.raises(ClusterError, match=message):
        check_cluster(task, get_spec(strategy))
