"""``python -m helpers.course.bench tp``: bytes a rank sends per training step, TP against DP.

Counted on real gloo ranks by ``CollectiveCounter``, which watches the collectives at
torch's dispatcher (so it sees the hand-written layers' ``tdist.all_reduce`` and DTensor's
functional collectives alike, forward and backward; not those DTensor runs inside another
operator, such as reducing a Partial gradient in the optimizer step, which torch's
``CommDebugMode`` sees), and modelled:

    TP (Megatron pairing, N ranks, L blocks, B*T tokens of width d, e bytes per number):
        4 all-reduces per block and step (attention and MLP, forward and backward),
        each of B*T*d*e bytes:      sent = 4 L * B T d e * 2(N-1)/N
    DP (every rank the whole model, P parameters): one all-reduce of the gradients:
                                    sent = P e * 2(N-1)/N

The figures are counted, not timed: the volumes follow from the shapes. TP's volume
grows with the tokens of a step, DP's with the model: TP sends more as soon as
B*T > P / (4 L d) (about 3 d tokens for a transformer whose MLP is 4 d wide). And TP's
messages sit on the critical path of every layer, where DP's overlap the backward pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import launch
from helpers.config import parse
from helpers.parallel.collectives import published_comm
from helpers.parallel.tensor import tp_inference as TI
from helpers.viz.common import machine_label

# Links, per GPU and direction, as the all-reduce of a TP group sees them, on the sites' GPU
# nodes. Every figure is a row of notebook 02's table (helpers.parallel.collectives.
# published_comm.LINKS, with its sources): the published all-reduce bus bandwidth where one
# exists (NVIDIA/nccl-tests#175: NCCL on an 8-A100 NVSwitch system, the kind of node Jean Zay's
# A100 partition has; measured there, not at Jean Zay), otherwise the link's line rate, which
# bounds a transfer's time from below only. The sites' 4-GPU nodes join their GPUs
# directly, without an NVSwitch (Perlmutter's A100: 4 NVLink 3 links to each of 3 peers; Jean
# Zay's H100: 6 NVLink 4 links to each), and no all-reduce figure has been published for such a
# mesh; Engaging's 4 H200 per node are not described publicly (`nvidia-smi topo -m` says how
# they are joined: if by NVLink 4, the H100 row applies). Engaging's L40S nodes have no NVLink:
# PCIe 4.0 x16. Between nodes: one 200 Gb/s port per GPU, line rate: Perlmutter's (4 Slingshot-11
# NICs for the 4 A100 of a GPU node, NERSC's architecture page); the workbook has not checked
# Jean Zay's or Engaging's GPU nodes (with 400 Gb/s ports every network time halves). The 8-GPU NVSwitch H100/H200 figures (367 GB/s ring, 482 with
# NVLink SHARP) belong to no site's nodes and are left out. The seeds give no link speeds
# ("fast NVLinks within a node, Infiniband across nodes").
_SITE_LINKS = {  # label: the row of published_comm.LINKS it comes from
    "NVLink 3 + NVSwitch, 8 A100 (Jean Zay A100)": "NVLink 3 through NVSwitch, 8 A100",
    "NVLink 3 mesh, 4 A100 (Perlmutter)": "NVLink 3, 4 A100 in a direct mesh (no NVSwitch)",
    "NVLink 4 mesh, 4 H100 (Jean Zay H100)": "NVLink 4, 4 H100/H200 in a direct mesh (no NVSwitch)",
    "PCIe 4.0 x16, no NVLink (Engaging L40S)": "PCIe 4.0 x16",
}


def _site_links() -> dict[str, float]:
    rows = {r["link"]: r for r in published_comm.LINKS}
    out = {}
    for label, name in _SITE_LINKS.items():
        row = rows[name]
        measured = row["busbw_GBps"] is not None
        gbps = row["busbw_GBps"] if measured else row["spec_GBps"]
        # a published figure is labelled with where it was measured (its issue), not as the site's
        source = re.search(r"nccl-tests#\d+", row["measured"]) if measured else None
        if measured and source is None:
            raise ValueError(f"{name}: a measured row must name its nccl-tests issue")
        out[f"{label}, {source.group(0) if measured else 'line rate'}"] = gbps * 1e9
    return out | {"network, 200 Gb/s per GPU": 25e9}


# {label: bytes/s}; an NVLink/PCIe label ends with "line rate" or with the nccl-tests issue that
# published its all-reduce bus bandwidth; the network is Perlmutter's, 200 Gb/s per GPU
LINKS = _site_links()


_NAMES = {  # dispatcher operator -> (collective, how to find the full tensor's bytes)
    "allreduce_": "all_reduce",
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
}


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(_nbytes(o) for o in obj)
    return 0


@dataclass
class CollectiveCounter(TorchDispatchMode):
    """``with CollectiveCounter(world) as c: ...``: every collective that ran, as
    (name, bytes of the full tensor), and what this rank sent with ring algorithms."""

    world: int
    calls: list = field(default_factory=list)

    def __post_init__(self):
        super().__init__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = func._schemaname.split("::")[-1] if hasattr(func, "_schemaname") else func.__name__
        op = op.split(".")[0]
        if op in _NAMES:
            name = _NAMES[op]
            if op in ("allgather_", "_allgather_base_"):
                full = _nbytes(args[0])  # the output holds every rank's piece
            elif op == "all_gather_into_tensor":
                full = _nbytes(args[0]) * args[1]  # input is one piece of group_size
            elif op in ("reduce_scatter_", "_reduce_scatter_base_"):
                full = _nbytes(args[1])
            else:
                full = _nbytes(args[0])
            self.calls.append((name, full))
        return func(*args, **(kwargs or {}))

    def count(self, name: str | None = None) -> int:
        return sum(1 for n, _ in self.calls if name in (None, n))

    def sent(self) -> float:
        """Bytes this rank sent: all-reduce 2(N-1)/N of the tensor, the others (N-1)/N."""
        n = self.world
        return sum((2 if c == "all_reduce" else 1) * (n - 1) / n * b for c, b in self.calls)


@dataclass
class BenchConfig:
    """python -m helpers.course.bench tp: bytes per step, TP against DP."""

    ranks: str = "2,4"
    tokens: str = "8,32,128,512"  # tokens per step (batch x sequence)
    seq: int = 8


def tp_sent_model(cfg: TI.DecoderConfig, tokens: int, world: int, elem: int = 4) -> float:
    return 4 * cfg.n_layers * tokens * cfg.dim * elem * 2 * (world - 1) / world


def dp_sent_model(n_params: int, world: int, elem: int = 4) -> float:
    return n_params * elem * 2 * (world - 1) / world


def _batch(tokens: int, seq: int, vocab: int):
    g = torch.Generator().manual_seed(0)
    shape = (max(tokens // seq, 1), min(seq, tokens))
    return torch.randint(0, vocab, shape, generator=g), torch.randint(0, vocab, shape, generator=g)


def measure_step(d, cfg: TI.DecoderConfig, tokens: int, seq: int, mode: str) -> float:
    """Bytes this rank sent during one training step ("tp" or "dp"), the collectives run."""
    x, y = _batch(tokens, seq, cfg.vocab)
    model = TI.tiny_decoder(cfg)
    if mode == "tp":  # every rank the whole batch, a slice of every weight
        TI.shard_decoder(model)
    else:  # every rank the whole model, its share of the batch
        x, y = x.chunk(d.world_size)[d.rank], y.chunk(d.world_size)[d.rank]
    with CollectiveCounter(d.world_size) as counter:
        nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        if mode == "dp":  # one all-reduce of all the gradients, flattened (what DDP's buckets do)
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            tdist.all_reduce(flat)
    return counter.sent()


def _measure_all(d, cfg: TI.DecoderConfig, tokens: list[int], seq: int) -> dict:
    out = {}
    for mode in ("tp", "dp"):
        for t in tokens:
            if mode == "dp" and t // seq < d.world_size:
                continue  # DP needs at least one sequence per rank
            out[mode, t] = measure_step(d, cfg, t, seq, mode)
    return out


def measure(cfg: TI.DecoderConfig, tokens: list[int], world: int, seq: int) -> dict:
    """{(mode, tokens): bytes rank 0 sent}, counted on ``world`` ranks (one launch)."""
    return launch.spawn(_measure_all, world, (cfg, tokens, seq))[0]


def main(argv: list[str] | None = None) -> None:
    bc = parse(BenchConfig, argv, prog="python -m helpers.course.bench tp")
    cfg = TI.DecoderConfig()
    n_params = sum(p.numel() for p in TI.tiny_decoder(cfg).parameters())
    tokens = [int(t) for t in bc.tokens.split(",")]
    print(f"bytes sent per rank per training step; decoder dim {cfg.dim}, {cfg.n_layers} blocks, "
          f"{n_params:,} parameters; {machine_label('gloo')}")  # fmt: skip
    print(f"{'ranks':>5} {'tokens':>7} {'TP measured':>12} {'TP model':>10} "
          f"{'DP measured':>12} {'DP model':>10}")  # fmt: skip
    for world in (int(r) for r in bc.ranks.split(",")):
        got = measure(cfg, tokens, world, bc.seq)
        for t in tokens:
            dp = got.get(("dp", t))
            print(f"{world:>5} {t:>7} {got['tp', t]:>12,.0f} {tp_sent_model(cfg, t, world):>10,.0f} "
                  f"{'-' if dp is None else f'{dp:,.0f}':>12} {dp_sent_model(n_params, world):>10,.0f}")  # fmt: skip
    print("Volumes do not depend on the hardware. Time does: divide by the link's bandwidth,")
    for name, bw in LINKS.items():
        print(f"  {name}: {bw / 1e9:.0f} GB/s per GPU and direction (LINKS says where from)")
