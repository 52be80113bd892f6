"""The emulated machines' cables (benchmarks/emulated_machines.py): tc shapes them to the rate asked, both ways.

Each test host is a namespace on one switch (tests/helpers/netns.py); the
benchmark's numbers mean something only if the shaping holds, so the test
measures it as the benchmark does, with a real TCP transfer between hosts.
"""

import pytest

from helpers import netns

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(netns.available()), reason=netns.available() or "ok")]


def test_a_shaped_cable_carries_its_rate_both_ways_and_unshaped_far_more():
    with netns.TestHosts(2) as hosts:
        hosts.shape("100mbit")
        there, back = hosts.measure_link(0, 1), hosts.measure_link(1, 0)
        for link in (there, back):
            assert 80 <= link["mbit_per_s"] <= 110, f"tbf at 100 Mbit/s let through {link['mbit_per_s']:.0f} Mbit/s"
            assert 0 < link["round_trip_us"] < 5000
        hosts.shape(None)
        free = hosts.measure_link(0, 1)
        assert free["mbit_per_s"] > 500, "without tc the veth carries several Gbit/s"
