"""The job checks' stand-in for DeepSpeed's compiled CPU Adam is Adam: torch's, step for step."""

from __future__ import annotations

import pytest
import torch

from helpers.standin.ds_accelerator import _CpuAdamInTorch


@pytest.mark.parametrize(
    "adamw_mode, reference", [(True, torch.optim.AdamW), (False, torch.optim.Adam)]
)
def test_cpu_adam_in_torch_steps_as_torch_adam(adamw_mode, reference):
    g = torch.Generator().manual_seed(0)
    start = torch.randn(50, generator=g, dtype=torch.float64)
    grads = [torch.randn(50, generator=g, dtype=torch.float64) for _ in range(3)]
    lr, betas, eps, wd = 1e-2, (0.9, 0.999), 1e-8, 0.1

    mine, m, v = (
        start.clone(),
        torch.zeros(50, dtype=torch.float64),
        torch.zeros(50, dtype=torch.float64),
    )
    adam = _CpuAdamInTorch()
    adam.create_adam(7, lr, *betas, eps, wd, adamw_mode, False)
    for step, grad in enumerate(grads, start=1):
        adam.adam_update(7, step, lr, *betas, eps, wd, True, mine, grad, m, v)

    theirs = torch.nn.Parameter(start.clone())
    opt = reference([theirs], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for grad in grads:
        theirs.grad = grad.clone()
        opt.step()
    torch.testing.assert_close(mine, theirs.detach(), rtol=0, atol=1e-12)
    assert not torch.equal(mine, start)
