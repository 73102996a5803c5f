"""PeakMemory on CPU: storages are keyed by the storage object, so fake tensors (whose
data_ptr() is 0 for all) and resized storages (FSDP2 frees gathered weights so) count right."""

import gc
import weakref

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


def test_a_storage_with_memory_before_counts_by_its_changes():
    t = torch.empty(1000)  # 4000 bytes, before the block: not the block's
    with PeakMemory() as mem:
        t.untyped_storage().resize_(0)
        freed = mem.mark("freed")  # below the start
        t.untyped_storage().resize_(4000)
        t.untyped_storage().resize_(6000)
    assert (freed, mem.peak, mem.held) == (-4000, 2000, 2000)


def test_storages_that_outlive_the_block_keep_no_callback_to_it():
    t = torch.empty(0)
    with PeakMemory() as mem:
        t.untyped_storage().resize_(400)
    mode = weakref.ref(mem._mode)
    del mem
    gc.collect()
    assert mode() is None  # a model's storages would otherwise keep every block's mode alive


def test_views_and_in_place_results_are_not_new_memory():
    with PeakMemory() as mem:
        t = torch.zeros(256)
        t.view(16, 16).add_(1)
        t[:10].mul_(2)
    assert mem.peak == 1024
