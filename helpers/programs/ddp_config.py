"""The options of helpers.programs.train_ddp: every field is a command-line option.

    python -m helpers.programs.train_ddp --batch-size 128 --lr-rule sqrt --sync manual

``helpers.config.parse(DDPConfig, argv)`` turns the command line into one; a
notebook builds one directly (``DDPConfig(epochs=3, lr=0.02)``) and calls
``train_ddp.train(d, cfg)`` on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers import data
from helpers.training import lr as lr_rules

__all__ = ["DDPConfig"]


@dataclass
class DDPConfig:
    """Data-parallel training of the workbook CNN (see the module docstring)."""

    # Every field is a command-line option: --batch-size 128 --lr-rule sqrt ...

    dataset: str = field(default="cifar10", metadata={"choices": data.DATASETS})
    offline: str = field(default="auto", metadata={"choices": ("auto", "true", "false")})
    data_root: str = ""
    # offline stand-in sizes (the real datasets are complete); "small": the device-strict check's
    n_train: int = field(default=8192, metadata={"small": 512})
    n_test: int = field(default=2000, metadata={"small": 64})
    epochs: int = field(default=2, metadata={"small": 1})
    # auto: bf16 autocast on a GPU with native bf16 (weights and gradients stay fp32), none on CPU
    amp: str = field(default="auto", metadata={"choices": ("auto", "none", "bf16")})
    max_steps: int = 0  # > 0: stop each epoch after this many steps (benchmarks)
    batch_size: int = 64  # per rank
    base_batch: int = 64  # the global batch that --lr was tuned for
    lr: float = 0.05
    lr_rule: str = field(default="none", metadata={"choices": lr_rules.LR_RULES})
    warmup_steps: int = 0
    momentum: float = 0.9
    bucket_cap_mb: float = 0.0  # 0: torch's default (25 MiB)
    # ddp: DistributedDataParallel; manual: average_gradients after backward;
    # none: no averaging at all (replicas drift apart: the bug to recognise);
    # fsdp: FSDP2 fully_shard (each rank holds 1/N of the weights; checkpoints are sharded)
    sync: str = field(default="ddp", metadata={"choices": ("ddp", "manual", "none", "fsdp")})
    set_epoch: bool = True
    # steps between host synchronisations: losses copied to the host, clock read, stop agreed
    log_every: int = 10
    seed: int = 0
    checkpoint: str = ""  # rank 0 saves the final model here
    evaluate: bool = True
    verbose: bool = True
    # Preemption safety: checkpoints in ckpt_dir, resume from the newest one there.
    ckpt_dir: str = ""
    ckpt_every: int = 0  # steps between checkpoints (0: only on a signal and at the end)
    keep: int = 2  # newest checkpoints kept
    deterministic: bool = False  # torch.use_deterministic_algorithms: bit-identical resumes
    # Fault injection for tests and demos: sleep after each step; the last rank
    # SIGKILLs itself after step crash_at_step, unless it resumed from a checkpoint.
    step_delay: float = 0.0
    crash_at_step: int = 0
