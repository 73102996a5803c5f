"""CoAtNet: convolution stages, then transformer stages (Dai et al. 2021, "Marrying
Convolution and Attention for All Data Sizes"), the large model of IDRIS's lab (seed 004).

    image (B, 3, 224, 224)
      S0 stem: conv 3x3 stride 2, conv 3x3                 (B, D0, 112, 112)
      S1 MBConv x L1  (first block halves H and W)         (B, D1, 56, 56)
      S2 MBConv x L2                                       (B, D2, 28, 28)
      S3 Transformer x L3 (tokens = 14 x 14 = 196)         (B, 196, D3)
      S4 Transformer x L4                                  (B, 49, D4)
      mean over tokens -> LayerNorm -> Linear              (B, classes)

MBConv: pre-BatchNorm, 1x1 conv expanding 4x, depthwise 3x3, squeeze-excite, 1x1 conv.
Transformer block: pre-LayerNorm, multi-head attention with a learned relative position
bias (heads of 32 channels), MLP 4x. A stage's first block downsamples by pooling and
projects its shortcut to the new width (the paper's x <- Proj(Pool(x)) + F(Pool(Norm(x)))).

CoAtNet-6 and -7 split S3 into an MBConv part and a transformer part at the same
resolution; ``CoAtNetConfig.kinds`` says which kind each stage is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["CoAtNetConfig", "CONFIGS", "PUBLISHED_PARAMS", "CoAtNet", "param_count", "config"]


@dataclass(frozen=True)
class CoAtNetConfig:
    depths: tuple[int, ...] = (2, 2, 3, 5, 2)  # stem convs, then blocks per stage
    dims: tuple[int, ...] = (64, 96, 192, 384, 768)
    kinds: tuple[str, ...] = ("C", "C", "T", "T")  # one per stage after the stem
    downsample: tuple[bool, ...] = (True, True, True, True)
    image_size: int = 224
    num_classes: int = 1000
    head_dim: int = 32
    expansion: int = 4  # MBConv
    mlp_ratio: int = 4  # transformer

    def __post_init__(self):
        stages = len(self.depths) - 1
        if not (len(self.dims) == stages + 1 and len(self.kinds) == len(self.downsample) == stages):
            raise ValueError(
                "depths and dims need one entry per stage plus the stem; kinds and "
                "downsample one per stage"
            )
        if self.image_size % (2 ** (1 + sum(self.downsample))):
            raise ValueError(
                f"image_size={self.image_size} must divide by "
                f"{2 ** (1 + sum(self.downsample))} (stem + downsampling stages)"
            )

    def stage_names(self) -> list[str]:
        """The paper's names: S1..S4, with a stage that shares its resolution with the next one
        (CoAtNet-6 and -7's S3) split into "S3-MBConv" and "S3-TFM" (Table 12)."""
        names, k = [], 0
        for i, kind in enumerate(self.kinds):
            shared = (i + 1 < len(self.kinds) and not self.downsample[i + 1]) or (
                i > 0 and not self.downsample[i]
            )
            if not (i > 0 and not self.downsample[i]):
                k += 1
            names.append(f"S{k}-{'MBConv' if kind == 'C' else 'TFM'}" if shared else f"S{k}")
        return names

    def resolutions(self) -> list[int]:
        """Feature-map side after the stem and after each stage."""
        side = [self.image_size // 2]
        for down in self.downsample:
            side.append(side[-1] // 2 if down else side[-1])
        return side


CONFIGS: dict[str, CoAtNetConfig] = {
    "tiny": CoAtNetConfig(
        depths=(1, 1, 1, 2, 1),
        dims=(16, 16, 32, 64, 128),
        image_size=64,
        num_classes=10,
        head_dim=16,
    ),
    "CoAtNet-0": CoAtNetConfig(),
    "CoAtNet-1": CoAtNetConfig(depths=(2, 2, 6, 14, 2)),
    "CoAtNet-2": CoAtNetConfig(depths=(2, 2, 6, 14, 2), dims=(128, 128, 256, 512, 1024)),
    # (the paper prints 1026 for S4: read as 1024, a multiple of the 32-channel heads)
    "CoAtNet-3": CoAtNetConfig(depths=(2, 2, 6, 14, 2), dims=(192, 192, 384, 768, 1536)),
    "CoAtNet-4": CoAtNetConfig(depths=(2, 2, 12, 28, 2), dims=(192, 192, 384, 768, 1536)),
    "CoAtNet-5": CoAtNetConfig(
        depths=(2, 2, 12, 28, 2), dims=(192, 256, 512, 1280, 2048), head_dim=64
    ),
    "CoAtNet-6": CoAtNetConfig(
        depths=(2, 2, 4, 8, 42, 2),
        dims=(192, 192, 384, 768, 1536, 2048),
        kinds=("C", "C", "C", "T", "T"),
        downsample=(True, True, True, False, True),
        head_dim=128,
    ),
    "CoAtNet-7": CoAtNetConfig(
        depths=(2, 2, 4, 8, 42, 2),
        dims=(192, 256, 512, 1024, 2048, 3072),
        kinds=("C", "C", "C", "T", "T"),
        downsample=(True, True, True, False, True),
        head_dim=128,
    ),
}

# Paper, Tables 3 and 4 (ImageNet-1K heads, 224 x 224), in millions of parameters.
PUBLISHED_PARAMS = {
    "CoAtNet-0": 25e6,
    "CoAtNet-1": 42e6,
    "CoAtNet-2": 75e6,
    "CoAtNet-3": 168e6,
    "CoAtNet-4": 275e6,
    "CoAtNet-5": 688e6,
    "CoAtNet-6": 1470e6,
    "CoAtNet-7": 2440e6,
}


def config(name: str, **overrides) -> CoAtNetConfig:
    if name not in CONFIGS:
        raise KeyError(f"unknown CoAtNet config {name!r}; choose one of {sorted(CONFIGS)}")
    return replace(CONFIGS[name], **overrides)


class MBConv(nn.Module):
    """Inverted bottleneck: BN -> 1x1 (x4) -> depthwise 3x3 -> SE -> 1x1, plus the shortcut."""

    def __init__(self, c_in: int, c_out: int, down: bool, expansion: int):
        super().__init__()
        mid = c_out * expansion
        self.shortcut = nn.Sequential(
            nn.MaxPool2d(2) if down else nn.Identity(),
            nn.Conv2d(c_in, c_out, 1) if (down or c_in != c_out) else nn.Identity(),
        )
        self.body = nn.Sequential(
            nn.BatchNorm2d(c_in),
            nn.Conv2d(c_in, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.GELU(),
            nn.Conv2d(mid, mid, 3, stride=2 if down else 1, padding=1, groups=mid, bias=False),
            nn.BatchNorm2d(mid),
            nn.GELU(),
            SqueezeExcite(mid, max(1, c_in // 4)),
            nn.Conv2d(mid, c_out, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W)
        return self.shortcut(x) + self.body(x)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, hidden, 1), nn.Conv2d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.fc2(F.silu(self.fc1(x.mean((2, 3), keepdim=True))))
        return x * scale.sigmoid()


class RelativeAttention(nn.Module):
    """Multi-head self-attention over an side x side grid with a learned relative position bias.

    q, k, v and proj are separate Linears so tensor parallelism can shard them like Megatron's
    attention (q/k/v column-wise, proj row-wise); the bias table holds one row per head.
    """

    def __init__(self, c_in: int, c_out: int, side: int, head_dim: int):
        super().__init__()
        if c_out % head_dim:
            raise ValueError(f"width {c_out} is not a multiple of head_dim={head_dim}")
        self.heads, self.head_dim = c_out // head_dim, head_dim
        self.q = nn.Linear(c_in, c_out)
        self.k = nn.Linear(c_in, c_out)
        self.v = nn.Linear(c_in, c_out)
        self.proj = nn.Linear(c_out, c_out)
        self.rel_table = nn.Parameter(torch.zeros(self.heads, (2 * side - 1) ** 2))
        ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        pos = torch.stack([ys.flatten(), xs.flatten()])  # (2, N)
        rel = pos[:, :, None] - pos[:, None, :] + side - 1  # (2, N, N), each in [0, 2 side - 2]
        self.register_buffer("rel_index", rel[0] * (2 * side - 1) + rel[1], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, N, c_in)
        b, n, _ = x.shape
        q, k, v = (
            m(x).view(b, n, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        table = self.rel_table
        if hasattr(table, "to_local"):  # a tensor-parallel shard: this rank's heads only
            table = table.to_local()
        bias = table[:, self.rel_index]  # (heads on this rank, N, N)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))


class TransformerBlock(nn.Module):
    """Pre-norm block on a token grid; ``down`` pools 2x2 first (x: (B, C, H, W) in and out)."""

    def __init__(self, c_in: int, c_out: int, side: int, down: bool, cfg: CoAtNetConfig):
        super().__init__()
        self.pool = nn.MaxPool2d(2) if down else nn.Identity()
        self.shortcut = nn.Linear(c_in, c_out) if (down or c_in != c_out) else nn.Identity()
        self.norm1 = nn.LayerNorm(c_in)
        self.attn = RelativeAttention(c_in, c_out, side, cfg.head_dim)
        self.norm2 = nn.LayerNorm(c_out)
        self.mlp = nn.Sequential(
            nn.Linear(c_out, cfg.mlp_ratio * c_out),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * c_out, c_out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(x)
        b, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)  # (B, N = H*W, C)
        t = self.shortcut(t) + self.attn(self.norm1(t))
        t = t + self.mlp(self.norm2(t))
        return t.transpose(1, 2).reshape(b, -1, h, w)


class CoAtNet(nn.Module):
    """stem, stages (an nn.Sequential each: ``stages[i]``), head. forward: (B,3,H,W) -> logits."""

    def __init__(self, cfg: CoAtNetConfig):
        super().__init__()
        self.cfg = cfg
        d0 = cfg.dims[0]
        stem = [nn.Conv2d(3, d0, 3, stride=2, padding=1)]
        for _ in range(cfg.depths[0] - 1):
            stem += [nn.BatchNorm2d(d0), nn.GELU(), nn.Conv2d(d0, d0, 3, padding=1)]
        self.stem = nn.Sequential(*stem)
        sides = cfg.resolutions()
        self.stages = nn.ModuleList()
        for i, kind in enumerate(cfg.kinds):
            c_in, c_out, blocks = cfg.dims[i], cfg.dims[i + 1], []
            for j in range(cfg.depths[i + 1]):
                down = cfg.downsample[i] and j == 0
                if kind == "C":
                    blocks.append(MBConv(c_in, c_out, down, cfg.expansion))
                else:
                    blocks.append(TransformerBlock(c_in, c_out, sides[i + 1], down, cfg))
                c_in = c_out
            self.stages.append(nn.Sequential(*blocks))
        self.head = nn.Sequential(
            nn.LayerNorm(cfg.dims[-1]), nn.Linear(cfg.dims[-1], cfg.num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.head(x.mean((2, 3)))


def param_count(cfg: CoAtNetConfig) -> int:
    """Built on the meta device: no memory, exact count."""
    with torch.device("meta"):
        model = CoAtNet(cfg)
    return sum(p.numel() for p in model.parameters())


def flops_per_image(cfg: CoAtNetConfig) -> int:
    """Forward FLOPs of one image (torch's FlopCounterMode on the meta device); x3 to train."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = CoAtNet(cfg)
        x = torch.empty(1, 3, cfg.image_size, cfg.image_size)
    with FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()
