"""Learning-rate rules and warm-up (helpers.training.lr), scaling efficiency (helpers.parallel.data.scaling)."""

import math

import pytest
import torch

from helpers.parallel.data.scaling import efficiency, local_batch, speedup
from helpers.training.lr import scale_lr, warmup_lr, warmup_scheduler


@pytest.mark.parametrize(
    ("rule", "k", "expected"),
    [
        ("none", 4, 0.1),
        ("linear", 4, 0.4),
        ("sqrt", 4, 0.2),
        ("linear", 1, 0.1),
        ("sqrt", 2, 0.1 * math.sqrt(2)),
    ],
)
def test_scale_lr_rules(rule, k, expected):
    assert scale_lr(0.1, k, rule) == pytest.approx(expected)


def test_scale_lr_rejects_unknown_rule_and_bad_ratio():
    with pytest.raises(ValueError, match="linear, sqrt"):
        scale_lr(0.1, 2, "cubic")
    with pytest.raises(ValueError, match="k must be > 0"):
        scale_lr(0.1, 0, "linear")


def test_warmup_ramps_linearly_then_holds():
    lrs = [warmup_lr(s, 0.1, 0.5, 4) for s in range(7)]
    assert lrs == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.5])
    # no warm-up: the peak from step 0
    assert warmup_lr(0, 0.1, 0.5, 0) == 0.5
    with pytest.raises(ValueError):
        warmup_lr(0, 0.1, 0.5, -1)


def _lrs(opt, sched, steps):
    seen = []
    for _ in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


def test_warmup_scheduler_is_torchs_linear_lr_and_matches_the_arithmetic():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.8)
    sched = warmup_scheduler(opt, 0.1, 0.8, 7)
    assert isinstance(sched, torch.optim.lr_scheduler.LinearLR)
    seen = _lrs(opt, sched, 9)
    assert seen == pytest.approx([0.1 + 0.1 * i for i in range(8)] + [0.8])
    assert seen == pytest.approx([warmup_lr(s, 0.1, 0.8, 7) for s in range(9)])


def test_no_warmup_when_steps_are_zero_or_the_peak_is_not_higher():
    for base, peak, steps in ((0.1, 0.8, 0), (0.4, 0.2, 5)):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=peak)
        assert _lrs(opt, warmup_scheduler(opt, base, peak, steps), 4) == pytest.approx([peak] * 4)


def test_efficiency_perfect_and_lossy():
    assert efficiency([1, 2, 4], [100, 200, 400]) == pytest.approx([1, 1, 1])
    assert efficiency([1, 2, 4], [100, 150, 100]) == pytest.approx([1, 0.75, 0.25])
    assert speedup([100, 150, 100]) == pytest.approx([1, 1.5, 1])
    # a baseline that is not one rank: efficiency relative to it
    assert efficiency([2, 4], [200, 300]) == pytest.approx([1, 0.75])


def test_efficiency_rejects_mismatched_input():
    with pytest.raises(ValueError, match="2 rank counts but 3"):
        efficiency([1, 2], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="positive baseline"):
        efficiency([1, 2], [0.0, 1.0])


def test_local_batch_splits_or_explains():
    assert local_batch(256, 4) == 64
    with pytest.raises(ValueError, match="multiple of 3"):
        local_batch(256, 3)


def test_add_efficiency_per_mode_and_table():
    from helpers.parallel.data.scaling import add_efficiency, format_table

    rows = [
        {"mode": "weak", "ranks": 1, "threads": 2, "local_batch": 64, "global_batch": 64,
         "samples_per_s": 1000.0},
        {"mode": "weak", "ranks": 2, "threads": 1, "local_batch": 64, "global_batch": 128,
         "samples_per_s": 1600.0},
        {"mode": "strong", "ranks": 1, "threads": 2, "local_batch": 128, "global_batch": 128,
         "samples_per_s": 1200.0},
        {"mode": "strong", "ranks": 4, "threads": 1, "local_batch": 32, "global_batch": 128,
         "samples_per_s": 1200.0, "oversubscribed": True},
    ]  # fmt: skip
    add_efficiency(rows)
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 0.8, 1.0, 0.25])
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, 1.6, 1.0, 1.0])
    table = format_table(rows)
    assert "oversubscribed" in table.splitlines()[-1]
    assert "0.80" in table.splitlines()[2]


def test_study_rejects_bad_modes_and_ranks():
    from helpers.course.scaling_study import StudyConfig, run_study

    with pytest.raises(ValueError, match="'weak' and/or 'strong'"):
        run_study(StudyConfig(modes="weak,fast"))
    with pytest.raises(ValueError, match="comma-separated integers"):
        run_study(StudyConfig(ranks="1,two"))
