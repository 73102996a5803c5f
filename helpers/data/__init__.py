"""Datasets and data loaders: CIFAR-10 and MNIST, or offline stand-ins of the same shape.

On a cluster the real datasets live in a data root (``$WORKBOOK_DATA``, else
``data/`` at the top of the checkout). Compute nodes often have no internet,
so fetch them once on a login node::

    python -m helpers.data fetch cifar10 mnist --root /path/to/data

This machine (and CI) cannot download anything, so each dataset has an offline
stand-in with the same tensor shapes that still teaches a network something:

    cifar10 -> "shapes": 10 classes of coloured shapes and textures, 3x32x32,
               random colours, sizes and positions plus pixel noise
    mnist   -> "digits": scikit-learn's bundled 8x8 handwritten digits
               (1,797 images, no download) upsampled to 20x20 and centred in
               28x28 like MNIST

    train_ds, test_ds, info = load("cifar10", offline="auto")
    print(info)                       # says plainly which data is in use

``offline``: False (default) needs the real data and raises an error naming
the fetch command if it is missing; True always uses the stand-in; "auto"
uses the real data when it is on disk and the stand-in otherwise, and says so.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from helpers import devices, standin
from helpers.data import synthetic
from helpers.dist import Dist, print0

__all__ = ["DatasetInfo", "load", "fetch", "data_root", "make_loader", "set_epoch", "DATASETS"]

DATA_ENV = "WORKBOOK_DATA"
FETCH_HINT = "python -m helpers.data fetch {name} --root {root}"

# Per-channel mean/std used by the seed (CIFAR: the PyTorch tutorial's 0.5) and
# the PyTorch MNIST example. Stand-ins use the same normalisation.
_SPECS = {
    "cifar10": {
        "title": "CIFAR-10",
        "shape": (3, 32, 32),
        "mean": (0.5, 0.5, 0.5),
        "std": (0.5, 0.5, 0.5),
        "classes": ("plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
        "standin": "shapes",
    },
    "mnist": {
        "title": "MNIST",
        "shape": (1, 28, 28),
        "mean": (0.1307,),
        "std": (0.3081,),
        "classes": tuple(str(i) for i in range(10)),
        "standin": "digits",
    },
}
DATASETS = tuple(_SPECS)


@dataclass(frozen=True)
class DatasetInfo:
    """What was loaded, so a notebook can say plainly which data it used."""

    name: str  # "cifar10" or "mnist": what was asked for
    source: str  # "real" or "offline"
    description: str  # one sentence for the learner
    shape: tuple[int, ...]  # (C, H, W) of one sample
    classes: tuple[str, ...]
    num_train: int
    num_test: int
    root: str

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def offline(self) -> bool:
        return self.source == "offline"

    def __str__(self) -> str:
        return self.description


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The data directory: ``root``, else ``$WORKBOOK_DATA``, else ``data/`` in the checkout."""
    if root:
        return Path(root).expanduser().resolve()
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV]).expanduser().resolve()
    from helpers.runs import workbook_root

    top = workbook_root()
    return (top / "data") if top else (Path.cwd() / "data").resolve()


def _check_name(name: str) -> str:
    key = name.lower().replace("-", "").replace("_", "")
    if key not in _SPECS:
        raise ValueError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")
    return key


def _torchvision_pair(name: str, root: Path, download: bool) -> tuple[Dataset, Dataset]:
    """torchvision's train/test sets, normalised; raises RuntimeError when missing."""
    from torchvision import datasets, transforms

    spec = _SPECS[name]
    tf = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize(spec["mean"], spec["std"])]
    )
    cls = {"cifar10": datasets.CIFAR10, "mnist": datasets.MNIST}[name]
    train = cls(str(root), train=True, transform=tf, download=download)
    test = cls(str(root), train=False, transform=tf, download=download)
    return train, test


def _standin(name: str, n_train: int | None, n_test: int | None, seed: int):
    spec = _SPECS[name]
    if name == "cifar10":
        n_train = 10_000 if n_train is None else n_train
        n_test = 2_000 if n_test is None else n_test
        x_tr, y_tr = synthetic.shapes(n_train, seed=seed)
        x_te, y_te = synthetic.shapes(n_test, seed=seed + 1_000_003)
        what = (
            f"synthetic 'shapes' ({n_train:,} train / {n_test:,} test, 10 classes of coloured "
            "shapes and textures, 3x32x32)"
        )
        classes = synthetic.SHAPE_CLASSES
    else:
        (x_tr, y_tr), (x_te, y_te) = synthetic.digits(n_train, n_test, seed=seed)
        what = (
            f"scikit-learn digits upsampled to 28x28 ({len(y_tr):,} train / {len(y_te):,} test, "
            f"10 classes; test images come only from {synthetic.DIGITS_TEST_POOL} held-out digits, "
            "and sizes beyond the pools add shifted copies)"
        )
        classes = spec["classes"]
    # Same normalisation as the real data: x in [0, 1] -> (x - mean) / std per channel.
    mean = torch.tensor(spec["mean"]).view(-1, 1, 1)
    std = torch.tensor(spec["std"]).view(-1, 1, 1)
    train = TensorDataset((x_tr - mean) / std, y_tr)
    test = TensorDataset((x_te - mean) / std, y_te)
    return train, test, what, classes


def load(
    name: str,
    root: str | os.PathLike | None = None,
    offline: bool | str = False,
    *,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    verbose: bool = True,
) -> tuple[Dataset, Dataset, DatasetInfo]:
    """Return ``(train_ds, test_ds, info)`` for "cifar10" or "mnist".

    offline: False needs the real dataset under ``root`` (error if missing);
        True uses the offline stand-in; "auto" prefers the real dataset and
        falls back to the stand-in, saying why.
    n_train, n_test: stand-in sizes (the real datasets are always complete).
    seed: the stand-in's generator seed (same seed -> same data on every rank).
    verbose: print (on rank 0) which data is in use.
    """
    name = _check_name(name)
    if offline not in (True, False, "auto"):
        raise ValueError(f"offline must be True, False or 'auto', got {offline!r}")
    spec = _SPECS[name]
    where = data_root(root)
    reason = "offline=True was requested"
    if offline is not True:
        try:
            train, test = _torchvision_pair(name, where, download=False)
        except RuntimeError as err:  # torchvision: "Dataset not found or corrupted"
            checking = standin.mode() or os.environ.get("WORKBOOK_ALLOW_STANDIN_DATA")
            if offline is False and not checking:  # a dry run or gpu-check checks code, not data
                raise FileNotFoundError(
                    f"{spec['title']} is not in {where}. Fetch it once on a machine with "
                    f"internet (a login node): `{FETCH_HINT.format(name=name, root=where)}`, "
                    f"or set ${DATA_ENV} to where it is, or pass offline='auto' to use the "
                    "offline stand-in."
                ) from err
            reason = f"{spec['title']} is not in {where}"
            if offline is False:
                reason += " (a check of a cluster job: the stand-in has the same shapes)"
        else:
            info = DatasetInfo(
                name, "real", f"Using real {spec['title']} from {where}", spec["shape"],
                spec["classes"], len(train), len(test), str(where),
            )  # fmt: skip
            if verbose:
                print0(info)
            return train, test, info
    train, test, what, classes = _standin(name, n_train, n_test, seed)
    info = DatasetInfo(
        name, "offline", f"Using offline stand-in for {spec['title']}: {what}, because {reason}.",
        spec["shape"], classes, len(train), len(test), str(where),
    )  # fmt: skip
    if verbose:
        print0(info)
    return train, test, info


def fetch(names: list[str], root: str | os.PathLike | None = None) -> Path:
    """Download the real datasets into the data root (run once, on a login node)."""
    where = data_root(root)
    where.mkdir(parents=True, exist_ok=True)
    for name in names:
        key = _check_name(name)
        train, test = _torchvision_pair(key, where, download=True)
        print(f"{_SPECS[key]['title']}: {len(train):,} train / {len(test):,} test in {where}")
    return where


def make_loader(
    ds: Dataset,
    batch_size: int,
    d: Dist | None = None,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    num_workers: int = 0,
    device: torch.device | None = None,
) -> DataLoader:
    """A DataLoader that gives each rank its own slice of ``ds`` when ``d.world_size > 1``.

    Distributed: a DistributedSampler deals out indices rank, rank+W, ... of a
    permutation shared by all ranks (same ``seed``). Call ``set_epoch(loader,
    epoch)`` before each epoch, or every epoch reuses the first permutation.
    When len(ds) is not a multiple of W, drop_last=False *pads* by repeating
    the first indices so every rank gets ceil(N/W) samples (an evaluation then
    counts a few samples twice); drop_last=True drops the tail so every rank
    gets floor(N/W). drop_last also drops the last incomplete batch.

    batch_size is per rank: the global batch is batch_size * world_size.

    device: where the batches go (default: ``d.device``, else the CPU). For a GPU the
    batches are pinned (page-locked host memory, ``helpers.devices.pin_memory``): the GPU
    copies them by DMA without a staging copy, and ``.to(device, non_blocking=True)``
    returns at once, so the copy overlaps the GPU's work.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = device if device is not None else (d.device if d is not None else None)
    common = dict(
        batch_size=batch_size,
        drop_last=drop_last,
        num_workers=num_workers,
        pin_memory=device is not None and devices.pin_memory(device),
        persistent_workers=num_workers > 0,
    )
    if d is not None and d.world_size > 1:
        sampler = DistributedSampler(
            ds, num_replicas=d.world_size, rank=d.rank, shuffle=shuffle, seed=seed,
            drop_last=drop_last,
        )  # fmt: skip
        return DataLoader(ds, sampler=sampler, **common)
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(ds, shuffle=shuffle, generator=gen if shuffle else None, **common)


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Reshuffle a distributed loader for ``epoch`` (a no-op for single-process loaders)."""
    if isinstance(loader.sampler, DistributedSampler):
        loader.sampler.set_epoch(epoch)


@dataclass
class FetchConfig:
    """Download CIFAR-10 and/or MNIST: python -m helpers.data fetch cifar10 mnist --root DIR"""

    root: str = ""


def main(argv: list[str] | None = None) -> None:
    from helpers.config import parse

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "fetch":
        raise SystemExit("usage: python -m helpers.data fetch cifar10 [mnist] [--root DIR]")
    rest = argv[1:]
    first_option = next((i for i, a in enumerate(rest) if a.startswith("-")), len(rest))
    names, options = rest[:first_option], rest[first_option:]
    if not names:
        raise SystemExit("usage: python -m helpers.data fetch cifar10 [mnist] [--root DIR]")
    cfg = parse(FetchConfig, options, prog="python -m helpers.data fetch NAME...")
    fetch(names, cfg.root or None)


if __name__ == "__main__":
    main()
