"""Models as the planner sees them: ``Block``s in a ``Workload`` (helpers.parallel.composed.planner).

    llama(args, seq_len)         Llama 2 (or 3) as helpers.models.llama2 runs it, eager, with
                                 the activation bytes counted for that block (llama_block_bytes)
    gpt_2021(layers, hidden, heads)   Megatron-LM's GPT of Narayanan et al. 2021 (no flash
                                 attention, no sequence parallelism), Korthikanti et al.'s count
    korthikanti(dim, seq_len)    34 s h bytes per layer: Korthikanti et al.'s count for a GELU
                                 GPT block whose s x s scores are not stored, for comparison
    megatron_block_bytes(args, seq_len)   Megatron-LM's own estimate for a Llama layer
    megatron_llama(args, seq_len)   Llama as Megatron-LM holds it, by that estimate

The activation rule is the one measured for the block that runs. For the workbook's Llama block
(RMSNorm and rotary embeddings upcast to fp32, SDPA, SwiGLU in plain PyTorch ops) autograd's
saved-tensor hooks count, per token and block, with h the width, f the SwiGLU width, H heads
of width hd (tests/unit/test_planner_rules.py checks the count for several shapes):

    bf16 compute   32 h + 8 f + 4 hd + 4 H + 8 bytes      (7B: 53.7 h; Korthikanti: 34 h)
    fp32           40 h + 16 f + 4 hd + 4 H + 8 bytes

each RMSNorm keeping two fp32 copies of its input, the SwiGLU four f-wide tensors, SDPA q, k,
v, its output and the log-sum-exp, the rotary table its slice (4 hd). With sequence
parallelism every tensor is split by TP except the all-gathered inputs of wq/wk/wv and w1/w3
(2 x h values) and the rotary table; without it the norms' tensors stay whole too. On one H100 this rule
and the memory rules predict the workbook's 7B-width run within a few percent (notebook 07).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Block", "Workload", "llama", "llama_block_bytes", "gpt_2021", "korthikanti",
           "megatron_block_bytes", "megatron_llama", "LOSS_BYTES", "activation_bytes",
           "default_frameworks"]  # fmt: skip


@dataclass(frozen=True)
class Block:
    """One layer as the planner sees it, per sample (one sequence or one image)."""

    params: float
    flops: float  # training FLOPs: forward + backward (3 x forward), no recomputation
    act_bytes: float  # what autograd saves for backward
    out_bytes: float  # its output: what a pipeline sends, what full recomputation keeps
    tp_bytes: float = 0.0  # all-reduced per forward under TP (summed over its collectives)
    tp_messages: int = 0  # collectives per forward under TP
    act_replicated: float = 0.0  # of act_bytes, what TP leaves whole on every TP rank
    tp: bool = True  # TP splits its weights and matmuls (False: replicated over the tp ranks)
    width: float = 0.0  # its matmuls' width (model dim), for Cluster.gemm_model; 0: not modelled
    score_bytes: float = 0.0  # of act_bytes, the s x s attention scores (selective recomputation)
    score_flops: float = 0.0  # forward FLOPs that rebuild them (selective recomputation reruns)


@dataclass(frozen=True)
class Workload:
    """What the planner needs to know about a model and its inputs (one sample = one sequence).

    Builders: ``Workload.llama`` (helpers.parallel.composed.workloads.llama) and
    ``workloads.gpt_2021``. ``framework``: the memory rules the states follow
    (helpers.parallel.composed.frameworks): a name, or pairs (ZeRO stage, name); stages it does
    not name follow the ZeRO paper's count of ``state_bytes``.
    """

    name: str
    blocks: tuple[Block, ...]
    seq_len: int  # tokens per sample (for an image model: tokens of its transformer stages)
    heads: int  # TP must divide them (the kv heads)
    state_bytes: tuple[float, float, float] = (2, 2, 12)  # weights, grads, optimizer per param
    logits_bytes: float = 0.0  # per sample, held by the last stage only (the loss's buffers)
    edge_params: tuple[float, float] = (0.0, 0.0)  # embedding (first stage), output (last)
    loss_split: bool = False  # the loss's buffers are split by TP (vocabulary-parallel)
    framework: str | tuple | None = None

    @property
    def params(self) -> float:
        """Parameters held (tied embedding and output weights count twice: two copies)."""
        return sum(b.params for b in self.blocks) + sum(self.edge_params)

    @property
    def layers(self) -> int:
        return len(self.blocks)

    @property
    def flops_per_sample(self) -> float:
        return sum(b.flops for b in self.blocks)

    def framework_for(self, zero: int) -> str | None:
        """The framework name this workload runs at ZeRO stage ``zero`` (None: the paper's count)."""
        if isinstance(self.framework, str) or self.framework is None:
            return self.framework
        return dict(self.framework).get(zero)

    @classmethod
    def llama(cls, args, seq_len: int = 4096, name: str = "Llama 2", **kw) -> Workload:
        """Llama in mixed precision with Adam (``llama`` below)."""
        kw.setdefault("framework", default_frameworks(kw.get("state_bytes", (2, 2, 12))))
        return llama(args, seq_len, name, **kw)


def default_frameworks(state_bytes) -> tuple:
    """bf16 with Adam: Megatron (ZeRO-0/1), DeepSpeed (2), FSDP2 (3); fp32: DDP, FSDP2."""
    if tuple(state_bytes) == (2, 2, 12):
        return ((0, "megatron"), (1, "megatron-distopt"), (2, "deepspeed-zero2-bf16"),
                (3, "fsdp2-bf16"))  # fmt: skip
    if tuple(state_bytes) == (4, 4, 8):
        return ((0, "ddp"), (3, "fsdp2-fp32"))
    return ()


def activation_bytes(dim: int, seq_len: int, bytes_per_value: int = 2,
                     sequence_parallel: bool = True) -> dict:  # fmt: skip
    """Korthikanti et al.'s 34 s h per layer (a GELU GPT block, scores not stored): kept for
    comparison; the planner's Llama uses the count of its own block (workloads.llama_block_bytes)."""
    return korthikanti(dim, seq_len, bytes_per_value, sequence_parallel)


# The loss of train_llama.py: bf16 logits, an fp32 copy for the softmax, log-probabilities
# saved (fp32), and at the start of backward two fp32 gradients: per logit value, at the peak
LOSS_BYTES = 4 + 4 + 4


def llama_block_bytes(args, seq_len: int, bytes_per_value: int = 2, norm: str = "eager") -> dict:
    """Bytes one workbook Llama block saves for backward, per sequence (see the module
    docstring): ``block`` in all, ``linear_inputs`` the part that stays whole on every TP rank
    with sequence parallelism, ``norms`` the part that stays whole without it. Each RMSNorm as
    ``norm`` says: "eager" this workbook's (x cast to fp32 twice: 10 h + 4 bytes at bf16),
    "torchtitan" torchtitan's 2024 eager RMSNorm (cast once: 6 h + 4), "fused" a fused kernel
    (x and 1/rms: 2 h + 4); the rest of the block is this workbook's, counted."""
    h, f, hd, heads = args.dim, args.ffn_hidden, args.head_dim, args.n_heads
    if bytes_per_value == 2:  # each norm: fp32 x twice, the bf16 normalised x; linear input
        norms, per_token = 2 * (10 * h + 4), 32 * h + 8 * f + 4 * hd + 4 * heads + 8
    elif bytes_per_value == 4:  # fp32: .float() is a no-op, one copy of x per norm
        norms, per_token = 2 * (8 * h + 4), 40 * h + 16 * f + 4 * hd + 4 * heads + 8
    else:
        raise ValueError(f"bytes_per_value={bytes_per_value}: 2 (bf16) or 4 (fp32)")
    if norm == "fused":  # a fused RMSNorm kernel (torchtitan's fused_rmsnorm) saves x and 1/rms
        other = 2 * (bytes_per_value * h + 4)
    elif norm == "torchtitan":  # torchtitan's eager RMSNorm casts x to fp32 once: one fp32 copy
        other = 2 * (4 * h + 4 + bytes_per_value * h) if bytes_per_value == 2 else norms
    elif norm == "eager":
        other = norms
    else:
        raise ValueError(f"norm={norm!r}: 'eager' (helpers.models.llama2), 'torchtitan' or 'fused'")
    per_token, norms = per_token - norms + other, other
    whole = 2 * bytes_per_value * h + 4 * hd  # the linear inputs, the rotary table (fp32)
    return {"block": seq_len * per_token, "linear_inputs": seq_len * whole,
            "norms": seq_len * (norms + whole)}  # fmt: skip


def megatron_block_bytes(args, seq_len: int) -> dict:
    """Megatron-LM's own estimate of a layer's activations, per sequence, with sequence
    parallelism and flash attention: s h (18 + 4 f / h) bytes, all of it split by TP
    (megatron/training/theoretical_memory_usage.py, ``compute_activation_memory``, Korthikanti et
    al.'s Table 2 with the MLP's 16 s h written 4 s f). A stated rule of its fused kernels, not
    a count of this workbook's block."""
    return {"block": seq_len * args.dim * (18 + 4 * args.ffn_hidden / args.dim), "replicated": 0.0}


def megatron_llama(args, seq_len: int = 4096, name: str = "Llama 2 (Megatron-LM)") -> Workload:
    """Llama as Megatron-LM runs it, by Megatron's own accounting: its activation estimate
    (``megatron_block_bytes``, sequence parallelism), its vocabulary-parallel loss (the logits
    split by TP) and its memory rules (18 bytes a parameter, 6 + 12/d distributed)."""
    w = llama(args, seq_len, name, act_bytes=megatron_block_bytes(args, seq_len)["block"],
              act_replicated=0.0, framework=default_frameworks((2, 2, 12))[:2])  # fmt: skip
    return replace(w, loss_split=True)


def korthikanti(dim: int, seq_len: int, bytes_per_value: int = 2,
                sequence_parallel: bool = True) -> dict:  # fmt: skip
    """Korthikanti et al. 2022: 34 s h bytes per layer at 2-byte values once the 5 a s^2 of the
    attention scores are not stored (their selective recomputation; flash attention does the
    same); without sequence parallelism 10 s h of it stays whole on every TP rank. They count
    each operator's saved inputs, unfused, dropout masks included: a GELU GPT block, not the
    workbook's Llama block (llama_block_bytes)."""
    per_value = bytes_per_value / 2
    return {"block": 34 * seq_len * dim * per_value,
            "replicated": 0.0 if sequence_parallel else 10 * seq_len * dim * per_value}  # fmt: skip


def llama(args, seq_len: int = 4096, name: str = "Llama 2", act_bytes=None, act_replicated=None,
          bytes_per_value: int = 2, state_bytes=(2, 2, 12), embeddings: bool = True,
          sequence_parallel: bool = True, framework=None, norm: str = "eager"):  # fmt: skip
    """Llama in mixed precision with Adam, layers of equal cost (planner.Workload.llama).

    FLOPs: 6 per parameter per token, plus the attention scores as a causal kernel computes
    them, 6 L d S (half of PaLM's 12 L d S). Activations: ``llama_block_bytes`` (the block that
    runs, counted), or ``act_bytes``/``act_replicated`` (a count of your own). The last stage
    holds the loss's buffers (LOSS_BYTES per logit value, whole on every TP rank: the plan
    gathers the logits); the first stage the embedding, the last the output layer
    (``edge_params``). ``embeddings=False``: a stack of blocks only (no embedding, no loss).
    ``framework``: the default memory rules (helpers.parallel.composed.frameworks).
    """
    from helpers.models import llama2

    outer = llama2.param_count(replace(args, n_layers=1)) - llama2.param_count(
        replace(args, n_layers=0)
    )  # one block's parameters
    edge = args.vocab_size * args.dim if embeddings else 0  # embedding, then output layer
    matmul = outer + edge / args.n_layers  # the output layer's FLOPs spread over the blocks
    flops = 6 * matmul * seq_len + 6 * args.dim * seq_len * seq_len
    value = seq_len * args.dim * bytes_per_value  # one (S, dim) activation
    counted = llama_block_bytes(args, seq_len, bytes_per_value, norm)
    whole = counted["linear_inputs"] if sequence_parallel else counted["norms"]
    block = Block(params=outer, flops=flops,
                  act_bytes=counted["block"] if act_bytes is None else act_bytes,
                  out_bytes=value, tp_bytes=2 * value, tp_messages=2,
                  act_replicated=whole if act_replicated is None else act_replicated,
                  width=args.dim)  # fmt: skip
    loss = seq_len * args.vocab_size * LOSS_BYTES if embeddings else 0.0
    return Workload(name, (block,) * args.n_layers, seq_len, args.kv_heads, tuple(state_bytes),
                    loss, edge_params=(edge, edge + args.dim * embeddings),
                    framework=framework)  # fmt: skip


def gpt_2021(layers: int, hidden: int, heads: int, seq_len: int = 2048, vocab: int = 51200,
             name: str = "GPT", framework: str = "megatron-fp16"):  # fmt: skip
    """Megatron-LM's GPT as Narayanan et al. 2021 trained it: fp16, no flash attention (the
    s x s scores are stored), no sequence parallelism, tied embedding and output weights (a
    copy on the first and on the last stage), vocabulary-parallel cross-entropy.

    Per layer and sequence: 12 h^2 + 13 h parameters; training FLOPs 72 s h^2 (1 + s / 6h)
    (the whole score matrix is computed); activations s h (34 + 5 a s / h) bytes, of which
    10 s h stays whole on every TP rank (Korthikanti et al. 2022, their count for this block);
    full recomputation keeps the 2 s h input; selective recomputation (Korthikanti et al.) drops
    the 5 a s^2 bytes of scores and reruns their 4 s^2 h forward FLOPs. The loss: fp32 logits
    split by TP, 6 bytes a value.
    """
    per_layer = 12 * hidden**2 + 13 * hidden
    logit_flops = 6 * seq_len * hidden * vocab / layers  # spread over the layers
    flops = 72 * seq_len * hidden**2 * (1 + seq_len / (6 * hidden)) + logit_flops
    act = seq_len * hidden * (34 + 5 * heads * seq_len / hidden)
    value = 2 * seq_len * hidden
    block = Block(params=per_layer, flops=flops, act_bytes=act, out_bytes=value,
                  tp_bytes=2 * value, tp_messages=2, act_replicated=10 * seq_len * hidden,
                  width=hidden, score_bytes=5 * heads * seq_len**2,
                  score_flops=4 * seq_len**2 * hidden)  # fmt: skip
    edge = vocab * hidden + seq_len * hidden  # word and position embeddings; the output is tied
    return Workload(name, (block,) * layers, seq_len, heads, (2, 2, 12),
                    seq_len * vocab * 6, edge_params=(edge, vocab * hidden),
                    loss_split=True, framework=framework)  # fmt: skip
