"""Train the workbook CNN on one device: the program behind notebook 01's jobs.

    python -m helpers.programs.train_cnn                       # this laptop, CPU
    python helpers/programs/train_cnn.py --epochs 10 --amp bf16
    sbatch job.sh                                              # 1 GPU (helpers.cluster.job)

The same file runs everywhere: helpers.dist.init() describes a single process
(rank 0 of 1) on cuda:0 when a GPU is visible and on the CPU otherwise, and
every tensor moves with ``.to(d.device)``. It trains with SGD, tests after
each epoch, and writes the results with helpers.runs.write_metrics.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from helpers import data, dist, models, training
from helpers.config import parse
from helpers.runs import write_metrics


@dataclass
class TrainConfig:
    """Train the workbook CNN on one device (see the module docstring)."""

    dataset: str = field(default="cifar10", metadata={"choices": data.DATASETS})
    offline: str = field(default="auto", metadata={"choices": ("auto", "true", "false")})
    data_root: str = ""  # empty: $WORKBOOK_DATA, else data/ in the checkout
    # offline stand-in sizes (the real datasets are complete); "small": the device-strict check's
    n_train: int = field(default=20_000, metadata={"small": 256})
    n_test: int = field(default=2_000, metadata={"small": 64})
    epochs: int = field(default=8, metadata={"small": 1})
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.9
    amp: str = field(default="none", metadata={"choices": ("none", "bf16", "fp16")})
    workers: int = 0  # DataLoader worker processes (try 2-8 on a GPU node)
    seed: int = 0


def run(cfg: TrainConfig, d: dist.Dist) -> dict:
    """Train and test; returns the metrics rank 0 writes."""
    dist.seed_all(cfg.seed)
    offline = {"auto": "auto", "true": True, "false": False}[cfg.offline]
    train_ds, test_ds, info = data.load(
        cfg.dataset, cfg.data_root or None, offline, n_train=cfg.n_train, n_test=cfg.n_test
    )
    # one device, whole dataset: no sampler (d is not passed); batches pinned for a GPU
    train_loader = data.make_loader(train_ds, cfg.batch_size, shuffle=True, seed=cfg.seed,
                                    num_workers=cfg.workers, device=d.device)  # fmt: skip
    test_loader = data.make_loader(test_ds, 500, shuffle=False, num_workers=cfg.workers,
                                   device=d.device)  # fmt: skip
    model = models.create(info.name, num_classes=info.num_classes).to(d.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    print(f"{d}: {models.count_parameters(model):,} parameters, amp={cfg.amp}", flush=True)
    history = training.fit(
        model, train_loader, test_loader, optimizer, d.device, cfg.epochs, cfg.amp
    )
    return {
        "config": asdict(cfg),
        "data": info.description,
        "device": str(d.device),
        "test_accuracy": history[-1]["test_accuracy"],
        "samples_per_s": max(h["samples_per_s"] for h in history),
        "history": [{k: v for k, v in h.items() if k != "step_losses"} for h in history],
    }


def main(argv: list[str] | None = None) -> None:
    cfg = parse(TrainConfig, argv)
    with dist.session() as d:
        write_metrics(run(cfg, d))


if __name__ == "__main__":
    main()
