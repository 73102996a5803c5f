"""helpers.data: offline stand-ins, the real-data path, errors, and distributed sharding."""

from __future__ import annotations

import struct

import pytest
import torch

from helpers import data
from helpers.data import synthetic
from helpers.dist import Dist


def test_cifar_standin_has_cifar_shape_balanced_labels_and_is_deterministic():
    train, test, info = data.load("cifar10", offline=True, n_train=200, n_test=50, verbose=False)
    x, y = train.tensors
    assert x.shape == (200, 3, 32, 32) and x.dtype == torch.float32
    assert torch.bincount(y, minlength=10).tolist() == [20] * 10
    # Normalised with mean 0.5 / std 0.5: pixels in [-1, 1].
    assert x.min() >= -1.0 and x.max() <= 1.0
    assert info.source == "offline" and info.offline and info.num_classes == 10
    assert (info.num_train, info.num_test) == (200, 50)
    again, _, _ = data.load("cifar10", offline=True, n_train=200, n_test=50, verbose=False)
    assert torch.equal(again.tensors[0], x)
    assert not torch.equal(test.tensors[0][:50], x[:50])  # test set drawn separately


def test_shapes_classes_differ_in_content_not_colour():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = synthetic.shapes(1200, seed=3)
    # Mean colour per class is about the same (colour is random), so colour is not the label.
    means = torch.stack([x[y == c].mean(dim=(0, 2, 3)) for c in range(10)])
    assert (means.max(0).values - means.min(0).values).max() < 0.1

    # ...and the content is: a linear model on the Fourier magnitudes of the grey-level
    # images (colour and position removed) learns the classes, while one on each image's
    # mean colour stays near chance (0.1).
    def held_out_accuracy(features):
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        return clf.fit(features[:1000], y[:1000]).score(features[1000:], y[1000:])

    grey = torch.fft.fft2(x.mean(dim=1)).abs().flatten(1).numpy()
    colour = x.mean(dim=(2, 3)).numpy()
    assert held_out_accuracy(grey) > 0.5
    assert held_out_accuracy(colour) < 0.3
    with pytest.raises(ValueError, match="at least one"):
        synthetic.shapes(0)


def test_mnist_standin_is_28x28_digits():
    train, test, info = data.load("mnist", offline=True, verbose=False)
    x, y = train.tensors
    assert x.shape[1:] == (1, 28, 28) and len(train) + len(test) == 1797
    assert set(y.tolist()) == set(range(10))
    # The digit sits in the centre: a 4-pixel border of (normalised) background.
    border = x[:, :, :4, :]
    assert torch.allclose(border, torch.full_like(border, -0.1307 / 0.3081))
    assert "scikit-learn digits" in str(info)


def test_missing_real_dataset_error_names_the_fetch_command(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        data.load("cifar10", root=tmp_path, verbose=False)
    msg = str(err.value)
    assert "python -m helpers.data fetch cifar10" in msg and str(tmp_path) in msg
    assert "offline='auto'" in msg


def test_auto_falls_back_and_says_why(tmp_path, capsys):
    _, _, info = data.load("cifar10", root=tmp_path, offline="auto", n_train=20, n_test=10)
    assert info.offline
    out = capsys.readouterr().out
    assert "Using offline stand-in for CIFAR-10" in out and f"not in {tmp_path}" in out


def _write_idx(path, magic, dims, payload: bytes):
    path.write_bytes(struct.pack(">" + "i" * (1 + len(dims)), magic, *dims) + payload)


def test_auto_prefers_real_data_on_disk(tmp_path):
    # A tiny MNIST in torchvision's on-disk format (idx files under MNIST/raw).
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", 12), ("t10k", 5)):
        images = bytes((i * 7) % 256 for i in range(n * 28 * 28))
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", 2051, (n, 28, 28), images)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", 2049, (n,), bytes(i % 10 for i in range(n)))
    train, test, info = data.load("mnist", root=tmp_path, offline="auto", verbose=False)
    assert info.source == "real" and (len(train), len(test)) == (12, 5)
    x, y = train[3]
    assert x.shape == (1, 28, 28) and y == 3


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="choose one of cifar10, mnist"):
        data.load("imagenet", offline=True)
    with pytest.raises(ValueError, match="offline must be"):
        data.load("mnist", offline="yes")
    with pytest.raises(ValueError, match="batch_size"):
        data.make_loader(torch.utils.data.TensorDataset(torch.zeros(4)), 0)
    with pytest.raises(SystemExit, match="usage"):
        data.main(["fetch"])
    with pytest.raises(ValueError, match="unknown dataset"):
        data.main(["fetch", "svhn", "--root", str(tmp_path)])


def test_data_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_DATA", str(tmp_path / "env"))
    assert data.data_root() == tmp_path / "env"
    assert data.data_root(tmp_path / "arg") == tmp_path / "arg"


def _indices(loader):
    return [i for batch in loader for i in batch[0].tolist()]


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_loader_shards_cover_the_dataset(world):
    ds = torch.utils.data.TensorDataset(torch.arange(12))
    shards = [
        _indices(data.make_loader(ds, 4, Dist(rank=r, world_size=world))) for r in range(world)
    ]
    assert all(len(s) == 12 // world for s in shards)
    assert sorted(sum(shards, [])) == list(range(12))  # disjoint and complete


def test_padding_and_drop_last_when_not_divisible():
    ds = torch.utils.data.TensorDataset(torch.arange(10))
    padded = [_indices(data.make_loader(ds, 8, Dist(rank=r, world_size=3))) for r in range(3)]
    assert [len(s) for s in padded] == [4, 4, 4]  # ceil(10/3): two samples appear twice
    assert set(sum(padded, [])) == set(range(10))
    dropped = [
        _indices(data.make_loader(ds, 8, Dist(rank=r, world_size=3), drop_last=True))
        for r in range(3)
    ]
    assert dropped == [[], [], []]  # floor(10/3) = 3 per rank, less than one batch of 8
    short = [
        _indices(data.make_loader(ds, 2, Dist(rank=r, world_size=3), drop_last=True))
        for r in range(3)
    ]
    assert [len(s) for s in short] == [2, 2, 2] and len(set(sum(short, []))) == 6


def test_set_epoch_reshuffles_consistently_across_ranks():
    ds = torch.utils.data.TensorDataset(torch.arange(64))
    loaders = [data.make_loader(ds, 64, Dist(rank=r, world_size=2), seed=5) for r in range(2)]
    first = [_indices(dl) for dl in loaders]
    assert first == [_indices(dl) for dl in loaders]  # without set_epoch: same order again
    for dl in loaders:
        data.set_epoch(dl, 1)
    second = [_indices(dl) for dl in loaders]
    assert second != first
    assert sorted(second[0] + second[1]) == list(range(64))  # still a partition


def test_single_process_loader_is_seeded():
    ds = torch.utils.data.TensorDataset(torch.arange(50))
    a = _indices(data.make_loader(ds, 10, seed=1))
    b = _indices(data.make_loader(ds, 10, seed=1))
    assert a == b and a != list(range(50))
    assert _indices(data.make_loader(ds, 10, shuffle=False)) == list(range(50))
    data.set_epoch(data.make_loader(ds, 10), 3)  # a no-op, not an error


def test_mnist_standin_serves_the_programs_default_sizes():
    # The programs ask for n_test=2000, more than sklearn's 1,797 digits hold.
    train, test, info = data.load("mnist", offline=True, n_train=3000, n_test=2000)
    assert (len(train), len(test)) == (3000, 2000)
    assert info.num_train == 3000 and info.num_test == 2000
    # Test images come only from the held-out pool: none equals a training image.
    x_tr = train.tensors[0].flatten(1)
    x_te = test.tensors[0][:200].flatten(1)
    assert torch.cdist(x_te, x_tr).min() > 1e-3


def test_mnist_standin_extra_images_are_shifted_copies_not_repeats():
    train, _, _ = data.load("mnist", offline=True, n_train=1600, n_test=100)
    x = train.tensors[0]
    assert len(x) == 1600
    assert x[:1500].std() > 0 and not torch.equal(x[1500:], x[:100])


def test_loaders_for_a_gpu_pin_their_batches_and_loaders_for_the_cpu_do_not():
    # Notebook 01's loaders never pinned memory on CUDA (only a Dist's device was asked).
    ds = torch.utils.data.TensorDataset(torch.arange(8))
    gpu = torch.device("cuda", 0)
    assert data.make_loader(ds, 4, device=gpu).pin_memory
    assert data.make_loader(ds, 4, Dist(device=gpu, backend="none")).pin_memory
    assert not data.make_loader(ds, 4, device=torch.device("cpu")).pin_memory
    assert not data.make_loader(ds, 4).pin_memory
