"""Set-up shared by the multi-rank tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    # Serial references run in the test process while the ranks run beside it: one thread
    # each keeps OpenMP from spinning on a 2-core CI box.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
