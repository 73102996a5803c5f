"""DeepSpeed on CPU ranks all-reduces through torch.distributed, as it does on GPUs.

Its CPU accelerator would otherwise compile a shared-memory all-reduce kernel in C++ on
first use (about a minute on 2 cores) and route its collectives around gloo, where the
workbook's counters and the stand-in GPU's device rule never see them.
"""

from __future__ import annotations


def test_deepspeed_on_cpu_compiles_no_shared_memory_kernel(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401  (the switch acts only once the program imported it)
    from deepspeed.comm.torch import build_shm_op

    from helpers import standin

    assert standin.deepspeed_through_torch() is True
    assert build_shm_op() is None  # before: a compiled module (and a minute of g++)
