"""train_ddp's loop waits for the device every log_every steps, not every step."""

import sys

import torch

from helpers.dist import Dist
from helpers.programs.train_ddp import DDPConfig, train
from helpers.training.step_log import StepLog

# 12 steps of 16 images on one process: the loop, without a process group.
SMALL = dict(dataset="mnist", offline="true", n_train=192, n_test=16, batch_size=16, epochs=1,
             evaluate=False, verbose=False)  # fmt: skip


def test_step_log_keeps_every_loss_and_times_all_but_the_first_step():
    log = StepLog(every=4)
    for k in range(10):
        log.record(torch.tensor(float(k)))
        if log.due():
            log.flush()
    log.flush()
    assert log.losses == [float(k) for k in range(10)]
    assert log.flushes == 4  # after steps 1, 4 and 8, and at the end
    assert log.timed_steps == 9  # the first step pays one-off costs: not timed


def test_training_loop_never_calls_item_and_logs_the_same_losses(monkeypatch):
    calls = []
    item = torch.Tensor.item

    def counting_item(self):  # the workbook's calls (torch's DataLoader draws a seed this way)
        caller = sys._getframe(1).f_code.co_filename
        if "/helpers/" in caller:
            calls.append(caller)
        return item(self)

    every_step = train(Dist(), DDPConfig(**SMALL, log_every=1))
    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    m = train(Dist(), DDPConfig(**SMALL, log_every=5))
    assert calls == [], f"the loop waited for the device with .item() {len(calls)} times"
    assert m["steps"] == 12 and m["host_syncs"] == 4  # steps 1, 5, 10 and the epoch's end
    assert m["loss"] == every_step["loss"]  # the same 12 losses, copied in 4 transfers
