"""The GPU table: memory, dense peaks by dtype, native bf16; and the peak a program divides by."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from helpers import dist, gpus
from helpers.config import SMALL_ENV, parse
from helpers.programs import train_llama as T

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name,key",
    [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-40GB", "a100-40"),
     ("NVIDIA A100-SXM4-80GB", "a100-80"), ("NVIDIA H200", "h200"), ("NVIDIA L40S", "l40s"),
     ("Tesla V100-SXM2-32GB", "v100-32"), ("Tesla V100-SXM2-16GB", "v100-16"),
     # these found the SXM H100, the H200, or nothing (KeyError) before
     ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"),
     ("NVIDIA H200 NVL", "h200-nvl"), ("NVIDIA GH200 480GB", "gh200"),
     ("NVIDIA GH200 144G HBM3e", "gh200-144"), ("NVIDIA A40", "a40"), ("NVIDIA L40", "l40"),
     ("Tesla T4", "t4")],
)  # fmt: skip
def test_device_names_find_their_gpu(name, key):
    assert gpus.lookup(name) is gpus.GPUS[key]


def test_dense_peaks_and_bf16_support():
    assert gpus.peak_flops("h100", "bf16") == pytest.approx(989.4e12)
    assert gpus.peak_flops("a100-40", "bf16") == pytest.approx(312e12)  # Perlmutter's A100s
    assert gpus.peak_flops("l40s", "bf16") == pytest.approx(362.05e12)
    assert gpus.peak_flops("h200", "bf16") == gpus.peak_flops("h100", "bf16")  # same chip
    assert not gpus.supports_bf16("v100-32") and gpus.supports_bf16("a100-80")
    with pytest.raises(ValueError, match="no bf16 rate"):
        gpus.peak_flops("v100-32", "bf16")
    with pytest.raises(KeyError, match="add it to helpers/gpus.py"):
        gpus.lookup("TPU v5")
    assert gpus.find("TPU v5") is None


def test_pcie_nvl_and_superchip_boards_have_their_own_dense_peaks():
    """NVIDIA's datasheets print sparse rates; the dense ones are half (H100 PCIe 1,513 -> 756.5,
    NVL 1,671 -> 835.5); the GH200 computes as the SXM H100 with its own 96 or 144 GB."""
    assert gpus.peak_flops("NVIDIA H100 PCIe", "bf16") == pytest.approx(756.5e12)
    assert gpus.peak_flops("NVIDIA H100 NVL", "bf16") == pytest.approx(835.5e12)
    assert gpus.peak_flops("NVIDIA GH200 480GB", "bf16") == gpus.peak_flops("h100", "bf16")
    assert 90 < gpus.lookup("NVIDIA GH200 480GB").memory_gib < 96  # not the H200's 141 GB
    assert gpus.peak_flops("NVIDIA A40", "bf16") == pytest.approx(149.7e12)
    assert gpus.peak_flops("NVIDIA L40", "bf16") == pytest.approx(181e12)
    assert not gpus.supports_bf16("Tesla T4") and gpus.peak_flops("Tesla T4", "fp16") == 65e12


def test_an_unknown_gpu_trains_and_says_its_mfu_is_unknown(monkeypatch):
    """train_llama crashed with KeyError on a GPU missing from the table (A40, L40, T4 did)."""
    d = dist.Dist(rank=0, world_size=1, device=torch.device("cuda", 0), backend="nccl")
    monkeypatch.setattr(dist, "device_name", lambda device: "NVIDIA RTX PRO 6000")
    monkeypatch.setattr(dist, "supports_bf16", lambda device: True)
    cfg = T.LlamaConfig()
    out = T.throughput(d, cfg, T._model_args(cfg), [0.3, 0.1, 0.1])
    assert out["mfu"] is None and out["tokens_per_s"] == pytest.approx(8 * 32 / 0.1)
    assert out["peak_source"].startswith("unknown peak for NVIDIA RTX PRO 6000 (bf16)")
    monkeypatch.setattr(dist, "device_name", lambda device: "NVIDIA A40")
    assert T.peak_flops(d, cfg) == (
        pytest.approx(149.7e12),
        "A40-48GB dense bf16 (helpers/gpus.py)",
    )


def test_train_llama_divides_by_the_peak_of_its_gpu_and_dtype(monkeypatch):
    """It used to divide every run by 989e12 (H100 bf16), fp32 runs and A100 jobs alike."""
    d = dist.Dist(rank=0, world_size=8, device=torch.device("cuda", 0), backend="nccl")
    monkeypatch.setattr(dist, "device_name", lambda device: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setattr(dist, "supports_bf16", lambda device: True)
    peak, source = T.peak_flops(d, T.LlamaConfig())
    assert peak == pytest.approx(312e12) and "A100-SXM4-40GB dense bf16" in source
    assert not torch.backends.cuda.matmul.allow_tf32  # PyTorch's default: fp32 matmuls stay fp32
    peak, source = T.peak_flops(d, T.LlamaConfig(dtype="fp32"))
    assert peak == pytest.approx(19.5e12) and "fp32" in source  # no tensor cores in plain fp32
    monkeypatch.setattr(dist, "supports_bf16", lambda device: False)  # a V100
    assert T.compute_dtype(d, T.LlamaConfig()) == torch.float32


def test_small_sizes_replace_the_command_line_for_the_device_strict_check(monkeypatch):
    argv = [
        "--model",
        "7B",
        "--dim",
        "1024",
        "--seq-len",
        "1024",
        "--batch-size",
        "32",
        "--tp",
        "2",
    ]
    assert parse(T.LlamaConfig, argv).seq_len == 1024
    monkeypatch.setenv(SMALL_ENV, "1")
    small = parse(T.LlamaConfig, argv)
    assert (small.model, small.dim, small.seq_len, small.batch_size) == ("tiny", 0, 32, 8)
    assert small.tp == 2  # the layout is the job's own


def test_07s_sequence_length_fits_the_model_it_builds():
    """07's job asks --seq-len 1024 of a model whose tiny config stops at 64 positions."""
    cfg = parse(T.LlamaConfig, ["--dim", "1024", "--n-layers", "8", "--seq-len", "1024"])
    assert T._model_args(cfg).max_seq_len >= 1024


def test_bf16_checks_exclude_emulation_everywhere():
    """torch.cuda.is_bf16_supported() says True on a V100 unless emulation is excluded."""
    sources = [*ROOT.glob("helpers/**/*.py"), *ROOT.glob("notebooks/*.ipynb"),
               *ROOT.glob("solutions/*/*.ipynb")]  # fmt: skip
    bare = re.compile(r"(?<!def )is_bf16_supported\((?!including_emulation=False)")
    offenders = [str(p.relative_to(ROOT)) for p in sources if bare.search(p.read_text())]
    assert not offenders, f"is_bf16_supported() without including_emulation=False in {offenders}"


def test_collective_timers_wait_for_the_device_before_each_clock_read(monkeypatch):
    """On a GPU a collective call only queues its kernel: the clock must be read after
    synchronize, before and after the timed call, and warm-up repeats are left out."""
    import time

    from helpers.parallel.collectives import collectives as C

    events = []
    monkeypatch.setattr(C, "synchronize", lambda device: events.append("sync"))
    monkeypatch.setattr(C.tdist, "barrier", lambda: events.append("barrier"))
    monkeypatch.setattr(C.tdist, "all_reduce", lambda t, op=None: None)
    clock = iter(range(1000))
    monkeypatch.setattr(time, "perf_counter", lambda: events.append("clock") or next(clock))
    d = dist.Dist(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    buf = torch.zeros(4)
    times = C._slowest_times(d, lambda d, b: events.append("op"), buf, buf.clone(), 3, 2)
    assert len(times) == 3  # 2 warm-up repeats left out
    for i, e in enumerate(events):
        if e == "clock":  # every clock read follows a synchronize (and the barrier after it)
            assert "sync" in events[max(0, i - 2) : i], events[: i + 1]
        if e == "op":
            assert events[i + 1 : i + 3] == ["sync", "clock"], events[i : i + 3]
