"""PeakMemory on CPU: storages are keyed by the storage object, so fake tensors (whose
data_ptr() is 0 for all) and resized storages (FSDP2 frees gathered weights so) count right."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers.training.peak_memory import PeakMemory


def test_fake_tensors_are_counted_one_by_one():
    with FakeTensorMode(), PeakMemory() as mem:
        a, b = torch.empty(1000), torch.empty(2000)  # both data_ptr() == 0
        assert mem.mark("both") == 12_000
        del a
        assert mem.mark("b") == 8_000
        c = b * 2  # noqa: F841
    assert (mem.peak, mem.held) == (16_000, 16_000)


def test_a_storage_resized_to_zero_and_back_counts_at_its_size():
    with PeakMemory() as mem:
        t = torch.empty(1000)
        t.untyped_storage().resize_(0)  # what FSDP2 does to free a gathered weight
        freed = mem.mark("freed")
        t.untyped_storage().resize_(4000)
        back = mem.mark("back")
    assert (freed, back, mem.peak, mem.held) == (0, 4000, 4000, 4000)
    assert mem.marks == {"freed": 0, "back": 4000}


def test_a_storage_made_empty_before_and_grown_inside_is_new_memory():
    # FSDP2 from its second step on: a layer's gathered weights live in storages made in the
    # first step and resized to 0 between uses; each gather resizes them back inside the block
    t = torch.empty(1000)
    t.untyped_storage().resize_(0)
    kept = torch.empty(500)  # made before, never resized: not the block's
    with PeakMemory() as mem:
        t.untyped_storage().resize_(4000)
        grown = mem.mark("grown")
        t.untyped_storage().resize_(0)
        kept.mul_(2)
    assert (grown, mem.peak, mem.held) == (4000, 4000, 0)


def test_views_and_in_place_results_are_not_new_memory():
    with PeakMemory() as mem:
        t = torch.zeros(256)
        t.view(16, 16).add_(1)
        t[:10].mul_(2)
    assert mem.peak == 1024
