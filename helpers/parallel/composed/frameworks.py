"""What real frameworks hold per GPU: the planner's memory rules for model states.

Bytes per parameter of the stage a GPU holds (its blocks after the TP split), d = the ranks
that shard the states (the data-parallel replicas):

    framework              weights  grads  fp32 master  Adam   sharded over d        extra
    torch DDP (AMP)        4        4      -            8      nothing               a flat copy of the gradients
                                                                                     in its buckets (4), unless
                                                                                     gradient_as_bucket_view=True
                                                                                     (with zero_grad(set_to_none=
                                                                                     False)); Adam's temporary (4)
    FSDP2, bf16 policy     4        4      -            8      all                   the gathered bf16 weights of
                                                                                     2 blocks (this one, the
                                                                                     prefetched next) and one
                                                                                     block's unsharded gradient
                                                                                     (bf16, then fp32 to reduce);
                                                                                     Adam's temporary (4/d)
    FSDP2, fp32            4        4      -            8      all                   2 gathered blocks, fp32
    Megatron, bf16         2        4      4            8      nothing: 18           (its docs' table)
    Megatron distributed   2        4      4            8      master, Adam: 6 + 12/d
    Megatron, fp16 (2021)  2        2      4 (+4)       8      nothing: 20           fp32 copies of the
                                                                                     gradients at the step
    Megatron fp16, torch DDP  as above                                       + DDP's flat copy of the fp16
                                                                                     gradients (2): Megatron-LM 2021
                                                                                     with --DDP-impl torch
    DeepSpeed ZeRO-1 bf16  2        2      4 (+4)       8      master, Adam          reduce bucket 5e8 values
                                                                                     (its default: the stage-1
                                                                                     ZeRO optimizer, bf16 grads)
    ... fp32 accumulation  2        4      4            8      master, Adam: 6 + 12/d  (BF16_Optimizer: only with
                                                                                     data_types.grad_accum_dtype
                                                                                     = "fp32")
    DeepSpeed ZeRO-2 bf16  2        2      4 (+4)       8      grads, master, Adam   reduce bucket 5e8 values
    DeepSpeed ZeRO-3 bf16  2        2      4 (+4)       8      all                   2 gathered blocks, bucket

Sources: torch's DistributedDataParallel docstring (``gradient_as_bucket_view``: "the saved
memory size will be equal to the total gradients size"); torch's ``fully_shard`` and
``MixedPrecisionPolicy`` docs (parameters kept sharded in fp32, all-gathered in
``param_dtype``, gradients reduced in ``reduce_dtype``; the next block's all-gather is issued
before this one computes); Megatron Core's "Distributed Optimizer" guide (the table
20 / 4 + 16/d, 18 / 6 + 12/d, 16 / 8 + 8/d); DeepSpeed 0.19.8 (``runtime/engine.py``:
``get_data_types`` takes the gradients' dtype from the model's unless ``grad_accum_dtype`` is
set, and ``_do_optimizer_sanity_check`` picks BF16_Optimizer for ZeRO-1 only with bf16 weights
and fp32 accumulation, else the ZeRO optimizer; ``runtime/bf16_optimizer.py``
keeps an fp32 gradient buffer the size of its bf16 parameters; ``zero/config.py``:
``reduce_bucket_size`` and ``allgather_bucket_size`` default to 5e8 elements). The rows
measured on CPU ranks (the DDP bucket copy, FSDP2's gathered blocks:
``framework_probe``, run by notebook 07 section 7 and tests/distributed/test_planner_validation.py)
are DDP's and FSDP2's; the others are the frameworks' own tables.

When: a training loop that calls ``zero_grad(set_to_none=True)`` (torch's default) frees the
gradients autograd allocates, so they are absent at the end of the forward, where the
activations peak: DDP's buckets (allocated when DDP is built) and Megatron's and DeepSpeed's
contiguous gradient buffers stay; DDP's ``param.grad`` (without the bucket view) and FSDP2's
gradients come back during the backward, when the activations are being freed. With more
than one micro-batch per step (accumulation, or a pipeline) they are there from the second
micro-batch's forward on: DDP without the bucket view then holds the gradients twice. The
planner takes the larger of the two peaks (plancost.memory).

Beyond the states, ``CONTEXT_NCCL_GIB`` (2 GiB) stands for the CUDA context and NCCL's buffers
(not measured here; NCCL alone keeps NCCL_BUFFSIZE, 4 MiB by default, per channel and peer of
each communicator), and ``MARGIN`` for what the caching
allocator reserves beyond what tensors hold (fragmentation): a layout *fits* when its
estimate stays under (GPU memory - context and NCCL) x (1 - MARGIN), the GPU's memory in GiB
as ``helpers.gpus`` gives it (an "80 GB" A100 has 80 GiB, 85.9 GB).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Framework", "FRAMEWORKS", "CONTEXT_NCCL_GIB", "MARGIN", "zero_paper", "lookup"]

CONTEXT_NCCL_GIB = 2.0  # CUDA context + NCCL buffers per GPU (a stated allowance, no allocator
# slack: MARGIN is the allocator's; the dry run's helpers.gpus.RESERVE_GIB counts both at once)
MARGIN = 0.10  # of what is left: the allocator's slack and fragmentation (a stated margin)
_PARTS = ("weights", "grads", "master", "moments")


@dataclass(frozen=True)
class Framework:
    """Bytes per parameter a framework holds, and which of them it shards over d ranks."""

    name: str
    weights: float  # the weights the forward reads
    grads: float  # the (main) gradients the backward accumulates into
    master: float  # fp32 master weights (0: the weights are the master copy)
    moments: float  # Adam's two moments
    sharded: tuple[str, ...] = ()  # of _PARTS, the ones divided by d
    bucket: float = 0.0  # a flat copy of the gradients (DDP's buckets), per parameter
    step_copy: float = 0.0  # fp32 temporaries of the optimizer step, sharded like the master:
    # Megatron's fp32 gradient copies (fp16), torch.optim.Adam's foreach sqrt (its GPU default)
    gathered_blocks: int = 0  # blocks whose weights are unsharded at once (ZeRO-3 / FSDP)
    gathered_weight: float = 0.0  # bytes per parameter of one gathered block's weights
    gathered_grad: float = 0.0  # bytes per parameter of one block's unsharded gradient
    fixed_bytes: float = 0.0  # fixed buffers per GPU (DeepSpeed's buckets)
    grads_transient: bool = False  # the grads are allocated in backward, freed by
    # zero_grad(set_to_none=True): absent at the forward's peak (DDP's param.grad, FSDP2's)
    zero: int = 0  # the ZeRO stage it corresponds to (what the planner's traffic rules use)
    source: str = ""

    def __post_init__(self):
        bad = [p for p in self.sharded if p not in _PARTS]
        if bad:
            raise ValueError(f"sharded parts {bad} unknown; use some of {_PARTS}")

    def per_parameter(self, d: int) -> float:
        """Bytes per parameter of the states (gathered blocks and fixed buffers aside)."""
        held = sum(getattr(self, p) / (d if p in self.sharded else 1) for p in _PARTS)
        step = self.step_copy / (d if "master" in self.sharded else 1)
        return held + step + self.bucket

    def states(self, local: float, largest: float, d: int) -> dict[str, float]:
        """Bytes held at the end of the forward (the activations' peak) on one GPU: ``local``
        parameters of its stage, ``largest`` of its biggest block. Transient gradients and the
        step's copies are not there yet (``late``)."""
        shard = {p: d if p in self.sharded else 1 for p in _PARTS}
        grads = 0.0 if self.grads_transient else self.grads * local / shard["grads"]
        return {
            "weights": (self.weights / shard["weights"] + self.master / shard["master"]) * local,
            "gradients": grads + self.bucket * local,
            "optimizer": self.moments * local / shard["moments"],
            "gathered": self.gathered_blocks * self.gathered_weight * largest,
            "buffers": self.fixed_bytes,
        }

    def late(self, local: float, largest: float, d: int) -> dict[str, float]:
        """Bytes that appear after the first forward: the transient gradients (``grads``:
        present in every later micro-batch's forward once accumulation or a pipeline has
        started), the last block's unsharded gradient (ZeRO-3) and the optimizer step's fp32
        copies (``step``: after the last backward)."""
        grads = self.grads * local / (d if "grads" in self.sharded else 1)
        return {"grads": grads if self.grads_transient else 0.0,
                "unsharded": self.gathered_grad * largest if self.gathered_blocks else 0.0,
                "step": self.step_copy * local / (d if "master" in self.sharded else 1)}  # fmt: skip


def zero_paper(state_bytes: tuple[float, float, float], zero: int) -> Framework:
    """The ZeRO paper's count (weights, gradients, optimizer bytes per parameter), stage
    ``zero`` sharding the optimizer (>= 1), the gradients (>= 2) and the weights (3, which
    also holds one gathered block's weights and gradients): no framework's extra buffers."""
    wb, gb, ob = state_bytes
    sharded = tuple(p for p, s in (("moments", 1), ("grads", 2), ("weights", 3)) if zero >= s)
    return Framework(f"ZeRO-{zero} ({wb:g} + {gb:g} + {ob:g} B)", weights=wb, grads=gb, master=0,
                     moments=ob, sharded=sharded, gathered_blocks=1 if zero >= 3 else 0,
                     gathered_weight=wb, gathered_grad=gb, zero=zero,
                     source="Rajbhandari et al. 2020 (ZeRO), no framework buffers")  # fmt: skip


_DS = "DeepSpeed 0.19.8 (runtime/engine.py, bf16_optimizer.py, zero/config.py)"
_MEG = "Megatron Core, 'Distributed Optimizer' guide (bytes per parameter table)"
_ALL = _PARTS
FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework(
            "ddp",
            4,
            4,
            0,
            8,
            bucket=4,
            grads_transient=True,
            step_copy=4,
            source="torch DDP (fp32 weights, AMP), torch.optim.Adam",
        ),  # fmt: skip
        Framework(
            "ddp-bucket-view",
            4,
            4,
            0,
            8,
            step_copy=4,
            source="torch DDP, gradient_as_bucket_view=True, zero_grad(set_to_none="
            "False), torch.optim.Adam",
        ),  # fmt: skip
        Framework(
            "fsdp2-bf16",
            4,
            4,
            0,
            8,
            _ALL,
            gathered_blocks=2,
            gathered_weight=2,
            gathered_grad=2 + 4,
            grads_transient=True,
            step_copy=4,
            zero=3,
            source="torch fully_shard + MixedPrecisionPolicy(bf16, reduce fp32)",
        ),  # fmt: skip
        Framework(
            "fsdp2-fp32",
            4,
            4,
            0,
            8,
            _ALL,
            gathered_blocks=2,
            gathered_weight=4,
            gathered_grad=4,
            grads_transient=True,
            step_copy=4,
            zero=3,
            source="torch fully_shard, fp32",
        ),  # fmt: skip
        Framework("megatron", 2, 4, 4, 8, source=_MEG + ": bf16 params, fp32 grads, 18"),
        Framework(
            "megatron-distopt",
            2,
            4,
            4,
            8,
            ("master", "moments"),
            zero=1,
            source=_MEG + ": 6 + 12/d",
        ),  # fmt: skip
        Framework(
            "megatron-fp16",
            2,
            2,
            4,
            8,
            step_copy=4,
            source=_MEG + ": fp16 params and grads, 20 (Megatron-LM 2021, --fp16)",
        ),  # fmt: skip
        Framework(
            "megatron-fp16-torch-ddp",
            2,
            2,
            4,
            8,
            bucket=2,
            step_copy=4,
            source=_MEG + " + torch DDP's flat copy of the fp16 gradients (Megatron-LM 2021, "
            "--DDP-impl torch)",
        ),  # fmt: skip
        Framework(
            "deepspeed-zero1-bf16",
            2,
            2,
            4,
            8,
            ("master", "moments"),
            step_copy=4,
            fixed_bytes=2 * 5e8,
            zero=1,
            source=_DS + ": its default, the ZeRO stage-1 optimizer with bf16 gradients",
        ),  # fmt: skip
        Framework(
            "deepspeed-zero1-bf16-fp32-accum",
            2,
            4,
            4,
            8,
            ("master", "moments"),
            zero=1,
            source=_DS + ": BF16_Optimizer, only with data_types.grad_accum_dtype='fp32'",
        ),  # fmt: skip
        Framework(
            "deepspeed-zero2-bf16",
            2,
            2,
            4,
            8,
            ("grads", "master", "moments"),
            step_copy=4,
            fixed_bytes=2 * 5e8,
            zero=2,
            source=_DS + ": reduce bucket 5e8 values",
        ),  # fmt: skip
        Framework(
            "deepspeed-zero3-bf16",
            2,
            2,
            4,
            8,
            _ALL,
            step_copy=4,
            gathered_blocks=2,
            gathered_weight=2,
            gathered_grad=2,
            fixed_bytes=2 * 5e8,
            zero=3,
            source=_DS + ": reduce bucket 5e8 values",
        ),  # fmt: skip
    )
}


def lookup(name: str) -> Framework:
    """FRAMEWORKS[name], or a clear error that lists the names."""
    if name not in FRAMEWORKS:
        raise KeyError(f"unknown framework {name!r}; choose one of {sorted(FRAMEWORKS)}")
    return FRAMEWORKS[name]
