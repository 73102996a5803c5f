"""helpers.training.loop: the loop learns, evaluation counts, mixed precision, throughput, profiler."""

from __future__ import annotations

import pytest
import torch

from helpers import data, models, training
from helpers.runs import read_metrics
from helpers.training import profiling

CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # These tiny models gain nothing from a second thread, and on a busy 2-core
    # CI machine an oversubscribed intra-op pool makes them many times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def shapes():
    return data.load("cifar10", offline=True, n_train=4000, n_test=1000, verbose=False)


def test_cnn_learns_the_offline_cifar_standin(shapes):
    train_ds, test_ds, info = shapes
    torch.manual_seed(0)
    model = models.CifarCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    before = training.evaluate(model, data.make_loader(test_ds, 500, shuffle=False), CPU)
    history = training.fit(
        model, data.make_loader(train_ds, 32), data.make_loader(test_ds, 500, shuffle=False),
        opt, CPU, epochs=3, log=None,
    )  # fmt: skip
    chance = 1 / info.num_classes
    assert before["accuracy"] < 1.6 * chance
    assert history[-1]["test_accuracy"] > 2 * chance, history
    assert history[-1]["train_loss"] < history[0]["step_losses"][0]
    assert len(history[0]["step_losses"]) == len(train_ds) // 32 + (len(train_ds) % 32 > 0)


def test_mnist_cnn_learns_the_digits():
    train_ds, test_ds, info = data.load("mnist", offline=True, verbose=False)
    torch.manual_seed(0)
    model = models.MnistCNN(width=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    history = training.fit(
        model, data.make_loader(train_ds, 32), data.make_loader(test_ds, 300, shuffle=False),
        opt, CPU, epochs=2, log=None,
    )  # fmt: skip
    assert history[-1]["test_accuracy"] > 0.6


def test_evaluate_counts_correct_predictions():
    class Fixed(torch.nn.Module):  # predicts class 1 for every input
        def forward(self, x):
            return torch.tensor([[0.0, 1.0, 0.0]]).expand(len(x), 3)

    x, y = torch.zeros(8, 2), torch.tensor([1, 1, 1, 0, 2, 1, 0, 0])
    out = training.evaluate(Fixed(), data.make_loader(torch.utils.data.TensorDataset(x, y), 3), CPU)
    assert out["samples"] == 8 and out["accuracy"] == pytest.approx(4 / 8)
    expected = torch.nn.functional.cross_entropy(Fixed()(x), y).item()
    assert out["loss"] == pytest.approx(expected, rel=1e-5)


def test_train_epoch_max_steps_and_stats(shapes):
    model = models.CifarCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = training.train_epoch(model, data.make_loader(shapes[0], 16), opt, CPU, max_steps=3)
    assert out["samples"] == 48 and len(out["step_losses"]) == 3
    assert out["samples_per_s"] > 0 and 0 <= out["accuracy"] <= 1


def test_bf16_autocast_on_cpu(shapes):
    model = models.CifarCNN()
    x = shapes[0].tensors[0][:4]
    with training.autocast(CPU, "bf16"):
        assert model(x).dtype == torch.bfloat16
    with training.autocast(CPU, None):
        assert model(x).dtype == torch.float32
    assert training.grad_scaler(CPU, "bf16") is None  # bf16 keeps fp32's range: no loss scaling
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = training.train_epoch(
        model, data.make_loader(shapes[0], 16), opt, CPU, amp="bf16", max_steps=2
    )
    assert all(torch.isfinite(torch.tensor(out["step_losses"])))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    assert training.default_amp(CPU) == "bf16"


def test_bad_amp_is_a_clear_error():
    with pytest.raises(ValueError, match="use amp='bf16' on CPU"):
        training.autocast(CPU, "fp16")
    with pytest.raises(ValueError, match="amp must be one of"):
        training.autocast(CPU, "fp8")


def test_throughput_leaves_the_model_untouched(shapes):
    model = models.CifarCNN()
    before = [p.clone() for p in model.parameters()]
    loader = data.make_loader(shapes[0], 32)
    for include_data in (True, False):
        out = profiling.throughput(model, loader, CPU, steps=3, warmup=1, include_data=include_data)
        assert out["samples_per_s"] > 0 and out["batch_size"] == 32 and out["steps"] == 3
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with pytest.raises(ValueError, match="steps"):
        profiling.throughput(model, loader, CPU, steps=0)


def test_profile_reports_phases_and_convolutions(shapes):
    summary = profiling.profile(
        models.CifarCNN(), data.make_loader(shapes[0], 32), CPU, steps=2, warmup=1
    )
    assert set(summary.phases) == {"data", "forward", "backward", "optimizer"}
    assert summary.phases["forward"] > 0 and summary.phases["backward"] > 0
    names = [op["name"] for op in summary.top_ops]
    assert any("conv" in n for n in names), names
    assert all(op["self_ms"] >= 0 for op in summary.top_ops)
    assert "Self CPU" in summary.table


def test_format_table_aligns_columns():
    text = profiling.format_table(
        [{"batch": 16, "samples/s": 1234.56}, {"batch": 512, "samples/s": 9.0}]
    )
    lines = text.splitlines()
    assert lines[0].split() == ["batch", "samples/s"] and len({len(ln) for ln in lines}) == 1
    assert "1,234.6" in lines[2] and lines[3].endswith("9.0")
    assert profiling.format_table([]) == "(no rows)"


def test_single_device_program_trains_and_writes_metrics(tmp_path, monkeypatch):
    from helpers.programs import train_cnn

    monkeypatch.setenv("WORKBOOK_METRICS", str(tmp_path / "metrics.json"))
    args = ["--epochs", "1", "--n-train", "64", "--n-test", "20", "--offline", "true"]
    train_cnn.main([*args, "--batch-size", "16", "--data-root", str(tmp_path)])
    metrics = read_metrics(tmp_path / "metrics.json")
    assert metrics["config"]["epochs"] == 1 and metrics["device"] == "cpu"
    assert 0 <= metrics["test_accuracy"] <= 1 and len(metrics["history"]) == 1
    assert "offline stand-in" in metrics["data"]
    with pytest.raises(SystemExit):
        train_cnn.main(["--amp", "fp8"])  # argparse names the valid choices


def test_default_amp_refuses_emulated_bf16(monkeypatch):
    # A V100 or T4 "supports" bf16 only by emulation: fp16 is the fast choice there.
    def emulated(including_emulation=True):
        return including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", emulated)
    assert training.default_amp(torch.device("cuda")) == "fp16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert training.default_amp(torch.device("cuda")) == "bf16"
    assert training.default_amp(torch.device("cpu")) == "bf16"


def test_the_loop_asks_helpers_devices_which_path_a_gpu_takes(monkeypatch):
    # A program never tests device.type == "cuda": the stand-in GPU of the dry run (device
    # type "gpu") must take the GPU's path, so the loop asks helpers.devices.
    from helpers import devices

    monkeypatch.setattr(devices, "is_gpu", lambda device: True)
    assert isinstance(training.grad_scaler(CPU, "fp16"), torch.amp.GradScaler)
    monkeypatch.setattr(devices, "supports_bf16", lambda device: False)
    assert training.default_amp(CPU) == "fp16"


def test_peak_memory_reads_the_allocator_helpers_devices_names(monkeypatch):
    from helpers import devices
    from helpers.training.peak_memory import PeakMemory

    class Allocator:  # what torch.cuda answers: bytes allocated now, and the most since a reset
        now, most = 1000, 1000

        def synchronize(self, device=None):
            pass

        def reset_peak_memory_stats(self, device=None):
            self.most = self.now

        def memory_allocated(self, device=None):
            return self.now

        def max_memory_allocated(self, device=None):
            return self.most

    stats = Allocator()
    monkeypatch.setattr(devices, "allocator_stats", lambda device: stats)
    with PeakMemory(CPU) as mem:
        stats.now, stats.most = 1500, 3000
    assert (mem.peak, mem.held) == (2000, 500)
