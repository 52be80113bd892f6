"""A model's layers cut into contiguous stages over the devices, as evenly as possible."""

import pytest

from tfdist.distribute.placement import stage_of_layers


def test_layers_are_cut_into_contiguous_stages_as_even_as_possible():
    assert stage_of_layers(2, 2) == [0, 1] and stage_of_layers(3, 2) == [0, 0, 1] and stage_of_layers(5, 3) == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError):
        stage_of_layers(2, 3)
