"""A TP size that does not fit the model or the job is refused with a message that says
which number failed (hidden size, heads, world size) and which TP sizes would work."""

import pytest

from helpers import launch
from helpers.parallel.tensor import tp as TP
from helpers.parallel.tensor import tp_inference as TI


def test_tp_size_must_divide_the_world_size():
    with pytest.raises(ValueError, match=r"does not divide the world size 4.*among \[1, 2, 4\]"):
        TP.check_tp_size(3, world_size=4)


def test_tp_size_must_divide_the_hidden_size():
    with pytest.raises(
        ValueError, match=r"3 does not divide the hidden size = 64.*\[1, 2, 4, 8, 16, 32, 64\]"
    ):
        TP.check_tp_size(3, hidden=64)


def test_tp_size_must_divide_the_number_of_heads():
    with pytest.raises(
        ValueError, match=r"8 does not divide the number of attention heads = 4.*\[1, 2, 4\]"
    ):
        TP.check_tp_size(8, world_size=8, hidden=64, heads=4)


def test_sizes_that_fit_pass():
    TP.check_tp_size(4, world_size=8, hidden=64, heads=4)
    TP.check_tp_size(1, world_size=3, hidden=7, heads=5)


def test_tp_size_must_be_positive():
    with pytest.raises(ValueError, match="must be >= 1"):
        TP.check_divides(0, 8, "the hidden size")


def _shard_on_ranks(d, n_heads, hidden):
    TI.shard_decoder(TI.tiny_decoder(TI.DecoderConfig(n_heads=n_heads, dim=48, hidden=hidden)))


def test_sharding_a_model_on_3_ranks_names_the_heads_then_the_hidden_size():
    # 4 heads on 3 ranks: the heads are checked first, and the message says what would work
    with pytest.raises(launch.RankFailure, match=r"number of attention heads = 4.*\[1, 2, 4\]"):
        launch.spawn(_shard_on_ranks, 3, (4, 96))
    # 6 heads fit 3 ranks, an MLP of 128 features does not
    with pytest.raises(
        launch.RankFailure, match=r"hidden size = 128.*\[1, 2, 4, 8, 16, 32, 64, 128\]"
    ):
        launch.spawn(_shard_on_ranks, 3, (6, 128))
