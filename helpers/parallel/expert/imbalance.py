"""What imbalance costs on real ranks: the EP layer timed part by part, and its peak memory.

A router that prefers some experts (``skew`` x a fixed popularity added to its logits, as
``ep_cost.routing_draw`` draws) sends every rank's tokens to the same few experts: every rank
sends about as much as before, but the rank holding the popular experts receives (and
computes) far more. ``time_layer`` runs one MoE layer on this rank, forward and backward, and
returns what the lesson needs:

    rows_received   this rank's experts' work (what the skew moves)
    layer_s         the forward, route to combine, with no barrier inside: every rank waits in
                    the combine for the slowest expert rank, so this is the same on every rank
                    and set by the busiest receiver
    dispatch_s, experts_s, combine_s, backward_s
                    each part alone, all ranks started together (a barrier before each)
    experts_cpu_s   the CPU seconds of this process in the experts, every thread counted (the
                    least of the repeats): the work itself, which CPU ranks sharing cores blur
                    far less than the wall time (on a GPU the kernels run elsewhere: 0)
    peak_bytes      the most tensor memory the layer's forward and backward held at once: the
                    received rows and the experts' activations grow with the rank's load

``cap`` (a capacity per source and expert) switches to the padded dispatcher
(``helpers.parallel.expert.padded``): every rank receives N E/N C rows whatever the skew.
"""

from __future__ import annotations

import statistics
import time

import torch.distributed as tdist

from helpers import devices
from helpers.parallel.expert.dispatch import combine, dispatch, run_experts
from helpers.parallel.expert.moe import Experts
from helpers.parallel.expert.padded import combine_padded, dispatch_padded, run_experts_padded
from helpers.parallel.expert.router import router_topk
from helpers.training.peak_memory import PeakMemory

__all__ = ["time_layer"]


def _timed(fn, device, repeats: int, group, barrier: bool = True):
    """(median wall seconds, least CPU seconds of this process, last result) of fn(): the least,
    because CPU time counts work, and a busy machine can only add to it (caches, shared cores).
    The process's CPU time counts torch's intra-op threads too (a rank with several threads)."""
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        if barrier:
            tdist.barrier(group=group)
        devices.synchronize(device)
        start, cpu = time.perf_counter(), time.process_time()
        out = fn()
        devices.synchronize(device)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), min(cpus), out


def _parts(x, router_weight, experts: Experts, n_experts: int, k: int, logit_bias, group, cap):
    """The layer as four functions (route, dispatch, experts, combine), dropless or padded."""
    n = tdist.get_world_size(group)

    def route():
        return router_topk(x @ router_weight + logit_bias, k)

    if cap is None:
        return (route, lambda r: dispatch(x, r, n_experts, group),
                lambda rec: run_experts(rec[0], rec[1].recv_counts, experts),
                lambda y, r, rec: combine(y, r, rec[1], group))  # fmt: skip
    return (route, lambda r: dispatch_padded(x, r, n_experts, cap, group=group),
            lambda rec: run_experts_padded(rec[0], experts, n),
            lambda y, r, rec: combine_padded(y, r, rec[1], group))  # fmt: skip


def time_layer(x, router_weight, experts: Experts, n_experts: int, k: int, logit_bias, group=None,
               repeats: int = 5, cap: int | None = None) -> dict:  # fmt: skip
    """One MoE layer on this rank's tokens x (requires grad), timed part by part (see the
    module's docstring). logit_bias [E]: added to the router's logits (the skew)."""
    device = x.device
    route, send, work, back = _parts(
        x, router_weight, experts, n_experts, k, logit_bias, group, cap
    )

    def layer():
        routing = route()
        received = send(routing)
        return back(work(received), routing, received)

    repeats = devices.repeats(repeats)
    with PeakMemory(device) as mem:  # first: also the warm-up (a first exchange sets up links)
        layer().square().mean().backward()
    layer_s, _, _ = _timed(layer, device, repeats, group)
    routing = route()
    dispatch_s, _, received = _timed(lambda: send(routing), device, repeats, group)
    # the experts alone, 5 times as often: the least of many CPU readings is the work itself
    experts_s, experts_cpu_s, y = _timed(lambda: work(received), device, 5 * repeats, group)
    combine_s, _, out = _timed(lambda: back(y, routing, received), device, repeats, group)
    backward_s, _, _ = _timed(lambda: out.sum().backward(), device, 1, group)  # once: no graph kept
    return {"rows_received": len(received[0]), "layer_s": layer_s, "dispatch_s": dispatch_s,
            "experts_s": experts_s, "experts_cpu_s": experts_cpu_s if not devices.is_gpu(device) else 0.0,
            "combine_s": combine_s, "backward_s": backward_s, "peak_bytes": mem.peak}  # fmt: skip
