"""Offline stand-ins for CIFAR-10 and MNIST, built without any download.

``shapes(n)``: a class-conditional image set with CIFAR-10's shape (3x32x32).
Each class is a shape or texture (disk, square, triangle, ring, plus, diamond,
horizontal/vertical stripes, checkerboard, X) drawn at a random position and
size, in a random colour on a random background, with Gaussian pixel noise.
Colour carries no information about the class, so a network has to learn
spatial features; similar foreground and background colours plus noise make
some samples genuinely hard, so accuracy climbs over several epochs instead
of jumping to 100%.

``digits()``: scikit-learn's bundled 8x8 handwritten digits (1,797 images,
shipped with the package) upsampled to 20x20 and centred in a 28x28 frame,
which is how MNIST digits are laid out.

Both return float tensors in [0, 1]; helpers.data normalises them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["SHAPE_CLASSES", "shapes", "digits"]

SHAPE_CLASSES = (
    "disk",
    "square",
    "triangle",
    "ring",
    "plus",
    "diamond",
    "h-stripes",
    "v-stripes",
    "checker",
    "cross",
)


def _masks(cls: int, dx: torch.Tensor, dy: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Foreground mask of class ``cls``.

    dx, dy: (n, 32, 32) pixel offsets from each sample's centre; r: (n, 1, 1) size.
    Returns a bool (n, 32, 32).
    """
    adx, ady = dx.abs(), dy.abs()
    box = torch.maximum(adx, ady) < r
    dist = torch.sqrt(dx**2 + dy**2)
    if cls == 0:  # disk
        return dist < r
    if cls == 1:  # square
        return box
    if cls == 2:  # triangle pointing up: width grows linearly from the top
        return (ady < r) & (adx < (dy + r) / 2)
    if cls == 3:  # ring
        return (dist < r) & (dist > 0.55 * r)
    if cls == 4:  # plus
        return ((adx < r / 3) & (ady < r)) | ((ady < r / 3) & (adx < r))
    if cls == 5:  # diamond
        return adx + ady < r
    if cls == 6:  # horizontal stripes inside the box (period 4 px)
        return box & (torch.remainder(dy.floor(), 4) < 2)
    if cls == 7:  # vertical stripes
        return box & (torch.remainder(dx.floor(), 4) < 2)
    if cls == 8:  # checkerboard of 3 px cells
        return box & (torch.remainder((dx / 3).floor() + (dy / 3).floor(), 2) < 1)
    if cls == 9:  # X: both diagonals
        return box & ((adx - ady).abs() < r / 4)
    raise ValueError(f"no shape class {cls}")


def shapes(
    n: int, seed: int = 0, size: int = 32, noise: float = 0.2
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images (n, 3, size, size) in [0, 1] and their labels (n,), balanced over 10 classes."""
    if n < 1:
        raise ValueError(f"need at least one sample, got n={n}")
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % len(SHAPE_CLASSES)
    y = y[torch.randperm(n, generator=g)]
    x = torch.empty(n, 3, size, size)
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    for cls in range(len(SHAPE_CLASSES)):
        idx = (y == cls).nonzero().flatten()
        k = len(idx)
        if k == 0:
            continue
        # Size 5-11 px "radius", centre anywhere that keeps most of the shape visible.
        r = torch.empty(k, 1, 1).uniform_(5.0, 11.0, generator=g)
        cx = torch.empty(k, 1, 1).uniform_(9.0, size - 9.0, generator=g)
        cy = torch.empty(k, 1, 1).uniform_(9.0, size - 9.0, generator=g)
        dx = coords.view(1, 1, size) - cx  # (k, 1, size) broadcast over rows
        dy = coords.view(1, size, 1) - cy  # (k, size, 1) broadcast over columns
        dx, dy = dx.expand(k, size, size), dy.expand(k, size, size)
        mask = _masks(cls, dx, dy, r).unsqueeze(1).float()  # (k, 1, size, size)
        fg = torch.rand(k, 3, 1, 1, generator=g)  # random colours: colour is not the label
        # Background: the foreground colour shifted by 0.25-0.75 in each channel (mod 1),
        # so the shape is always visible, though in some samples only faintly after noise.
        bg = torch.remainder(fg + torch.empty(k, 3, 1, 1).uniform_(0.25, 0.75, generator=g), 1.0)
        x[idx] = bg + (fg - bg) * mask
    x += noise * torch.randn(x.shape, generator=g)
    return x.clamp_(0.0, 1.0), y


def digits(
    n_train: int | None = None, n_test: int | None = None, seed: int = 0
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """scikit-learn's digits as MNIST-shaped tensors: ((x_train, y_train), (x_test, y_test)).

    x: (n, 1, 28, 28) in [0, 1]. The 1,797 images are split once by a seeded
    shuffle into a training pool of 1,500 and a test pool of 297, so no test
    image is a training image. Defaults return the pools as they are. Asking for
    more images than a pool holds adds shifted copies (up to 3 pixels each way)
    of that pool's images, so any size works and test images still come only from
    the test pool.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()  # ships with scikit-learn: no download
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (1797, 1, 8, 8)
    y = torch.tensor(bunch.target, dtype=torch.long)
    x = F.interpolate(x, size=(20, 20), mode="bilinear", align_corners=False)
    x = F.pad(x, (4, 4, 4, 4)).clamp_(0.0, 1.0)  # (1797, 1, 28, 28), digit centred like MNIST
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=gen)
    test_pool, train_pool = perm[:DIGITS_TEST_POOL], perm[DIGITS_TEST_POOL:]
    train = _resample(x[train_pool], y[train_pool], n_train, gen, "n_train")
    test = _resample(x[test_pool], y[test_pool], n_test, gen, "n_test")
    return train, test


DIGITS_TEST_POOL = 297  # held-out images of sklearn's 1,797 digits (1,500 remain for training)


def _resample(x, y, n, gen, what):
    """n images from a pool: a prefix of the pool, then randomly shifted copies of it."""
    if n is None:
        return x, y
    if n < 1:
        raise ValueError(f"{what} must be at least 1, got {n}")
    if n <= len(y):
        return x[:n], y[:n]
    extra = n - len(y)
    src = torch.randint(len(y), (extra,), generator=gen)
    shifts = torch.randint(-3, 4, (extra, 2), generator=gen)
    copies = torch.stack(
        [
            torch.roll(x[i], shifts=(int(dy), int(dx)), dims=(1, 2))
            for i, (dy, dx) in zip(src, shifts, strict=True)
        ]
    )  # the digit sits in a 4-pixel empty border, so a roll of <= 3 never wraps ink around
    return torch.cat([x, copies]), torch.cat([y, y[src]])
