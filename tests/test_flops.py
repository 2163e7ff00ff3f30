"""Multiply-adds per sample of the built-in models (:mod:`sim.learning.flops`), each pinned to a count
done by hand from the layer shapes in :mod:`sim.learning.models`."""

from __future__ import annotations

import pytest

from sim.learning.flops import multiply_adds
from sim.learning.models import MODELS


def test_linear_is_inputs_times_classes():
    assert multiply_adds("linear", (1, 60, 50), 10) == 1 * 60 * 50 * 10 == 30_000
    assert multiply_adds("linear", (3, 8, 8), 7) == 3 * 8 * 8 * 7


def test_mlp_is_its_three_dense_layers():
    assert multiply_adds("mlp", (1, 28, 28), 62) == 784 * 200 + 200 * 200 + 200 * 62 == 209_200


def test_cnn_on_femnist():
    # conv1 1->32 3x3 on 26x26 outputs, conv2 32->64 3x3 on 24x24, dense 64*12*12=9216 -> 128, dense 128 -> 62
    expected = 1 * 32 * 9 * 26 * 26 + 32 * 64 * 9 * 24 * 24 + 9216 * 128 + 128 * 62
    assert multiply_adds("cnn", (1, 28, 28), 62) == expected == 11_999_104


def test_vgg19_on_cifar():
    # (cin, cout, output side): the 16 padded 3x3 convs, halved by each max-pool; then Linear(512, 10)
    convs = (
        [(3, 64, 32), (64, 64, 32), (64, 128, 16), (128, 128, 16), (128, 256, 8)]
        + [(256, 256, 8)] * 3
        + [(256, 512, 4)]
        + [(512, 512, 4)] * 3
        + [(512, 512, 2)] * 4
    )
    expected = sum(cin * cout * 9 * side * side for cin, cout, side in convs) + 512 * 10
    assert multiply_adds("vgg19", (3, 32, 32), 10) == expected == 398_136_320


def test_resnet18_on_cifar():
    # stem 3->64 at 32x32; per stage (channels, side): the first block's two 3x3 convs (the first one
    # strided) and its 1x1 shortcut where the shape changes, the second block's two 3x3 convs; Linear(512, 10)
    stem = 3 * 64 * 9 * 32 * 32
    stage64 = 4 * 64 * 64 * 9 * 32 * 32
    stages = sum(
        (cin * cout * 9 + 3 * cout * cout * 9 + cin * cout) * side * side
        for cin, cout, side in ((64, 128, 16), (128, 256, 8), (256, 512, 4))
    )
    expected = stem + stage64 + stages + 512 * 10
    assert multiply_adds("resnet18", (3, 32, 32), 10) == expected == 555_422_720


@pytest.mark.parametrize("name", MODELS)
def test_every_built_in_model_counts_and_grows_with_the_image(name):
    small = multiply_adds(name, (1, 8, 8), 10)
    assert isinstance(small, int) and small > 0
    assert multiply_adds(name, (1, 16, 16), 10) > small


def test_unknown_model_and_too_small_image_are_refused():
    with pytest.raises(ValueError, match="unknown model 'lenet'"):
        multiply_adds("lenet", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="at least 6x6"):
        multiply_adds("cnn", (1, 4, 4), 10)
