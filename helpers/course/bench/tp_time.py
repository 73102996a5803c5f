"""``python -m helpers.course.bench tp_time``: where a tensor-parallel step's time goes.

Two measurements on real gloo ranks, one thread per rank, every figure a list of repeats
(the first step of each run is a warm-up and is left out):

* ``degree``: a training step of the small decoder (hand-written Megatron TP) at TP = 1, 2
  and 4; its time, and the part of it spent inside TP's collectives (a ``CommLog`` that
  times each call). Compute = step - collectives. TP divides the matrix products by t; it
  does not divide the collectives, which sit between the layers and wait for every rank.
* ``overlap``: the backward of one column-parallel linear layer, its input-gradient
  all-reduce run after the weight gradient (synchronous) or while it is computed
  (``tp_async``, as Megatron and picotron do), the two interleaved repeat by repeat.

On CPU ranks the collectives and the matrix products share the same cores, and a time
inside a collective includes waiting for the slowest rank. On GPUs, NCCL moves data with
its own resources (copy engines, NVLink, the NIC) while the SMs compute, which is what
makes overlap pay off there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import nn

from helpers import launch
from helpers.config import parse
from helpers.dist import synchronize
from helpers.parallel.tensor import tp as TP
from helpers.parallel.tensor import tp_async as TA
from helpers.parallel.tensor import tp_inference as TI
from helpers.viz.common import machine_label

__all__ = ["degree_sweep", "overlap_runs", "step_times"]


def step_times(d, cfg: TI.DecoderConfig, batch: int, seq: int, repeats: int) -> dict:
    """On each rank: seconds per training step and seconds inside TP's collectives."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab, (batch, seq + 1), generator=g).to(d.device)
    log = TP.CommLog(timed=True)
    model = TI.tiny_decoder(cfg).to(d.device)
    if d.world_size > 1:
        TI.shard_decoder(model, log=log)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    out = {"step": [], "comm": []}
    for i in range(repeats + 1):  # step 0: warm-up, not recorded
        log.clear()
        synchronize(d.device)
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad()
        synchronize(d.device)
        if i:
            out["step"].append(time.perf_counter() - t0)
            out["comm"].append(log.seconds())
    return out


def degree_sweep(cfg, batch: int, seq: int, degrees=(1, 2, 4), repeats: int = 5) -> dict:
    """{t: {"step": [...], "comm": [...]}} of rank 0, one thread per rank."""
    return {t: launch.spawn(step_times, t, (cfg, batch, seq, repeats), threads=1)[0]
            for t in degrees}  # fmt: skip


def _backward_once(d, full: nn.Linear, x: torch.Tensor, overlap: bool) -> dict:
    log = TP.CommLog(timed=True)
    layer = TA.AsyncColumnParallelLinear(full, log=log, overlap=overlap)
    xx = x.clone().requires_grad_()
    y = layer(xx)
    grad = torch.ones_like(y)
    tdist.barrier()  # both ranks start together: a wait then measures the collective, not the skew
    synchronize(d.device)
    t0 = time.perf_counter()
    y.backward(grad)
    synchronize(d.device)
    return {"backward": time.perf_counter() - t0, **log.phases[0]}


def overlap_runs(d, rows: int, fan_in: int, fan_out: int, repeats: int) -> dict:
    """On each rank: {False: [phases of each repeat], True: [...]}, synchronous and
    overlapped backward interleaved so that both see the same machine load."""
    torch.manual_seed(0)
    full = nn.Linear(fan_in, fan_out).to(d.device)
    x = torch.randn(rows, fan_in, generator=torch.Generator().manual_seed(1)).to(d.device)
    out = {False: [], True: []}
    for i in range(repeats + 1):
        for overlap in (False, True) if i % 2 else (True, False):
            phases = _backward_once(d, full, x, overlap)
            if i:
                out[overlap].append(phases)
    return out


@dataclass
class BenchConfig:
    """python -m helpers.course.bench tp_time: TP step time by degree, and overlap."""

    what: str = "degree,overlap"
    repeats: int = 7
    dim: int = 256


def _median(xs):
    return sorted(xs)[len(xs) // 2]


def main(argv: list[str] | None = None) -> None:
    bc = parse(BenchConfig, argv, prog="python -m helpers.course.bench tp_time")
    print(f"one thread per rank; medians (min-max) of {bc.repeats} repeats; "
          f"{machine_label('gloo')}")  # fmt: skip
    if "degree" in bc.what:
        cfg = TI.DecoderConfig(dim=bc.dim, n_heads=8, hidden=4 * bc.dim, n_layers=4,
                               max_len=256, vocab=256)  # fmt: skip
        print(f"\ntraining step, decoder dim {bc.dim}, 4 blocks, 8 x 128 tokens")
        print(f"{'TP':>3} {'step ms':>18} {'collectives ms':>18} {'compute ms':>11}")
        for t, r in degree_sweep(cfg, 8, 128, repeats=bc.repeats).items():
            comp = [s - c for s, c in zip(r["step"], r["comm"], strict=True)]
            span = f"{1e3 * min(r['step']):.0f}-{1e3 * max(r['step']):.0f}"
            print(f"{t:>3} {1e3 * _median(r['step']):>8.0f} ({span:>8}) "
                  f"{1e3 * _median(r['comm']):>17.0f} {1e3 * _median(comp):>11.0f}")  # fmt: skip
    if "overlap" in bc.what:
        print("\ncolumn-parallel backward on 2 ranks, rows 4096, 1024 -> 1024")
        runs = launch.spawn(overlap_runs, 2, (4096, 1024, 1024, bc.repeats), threads=1)[0]
        for overlap, rows in runs.items():
            b = [r["backward"] for r in rows]
            name = "overlapped" if overlap else "synchronous"
            print(f"{name:>12}: {1e3 * _median(b):.0f} ms ({1e3 * min(b):.0f}-{1e3 * max(b):.0f})")
