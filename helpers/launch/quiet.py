"""Library messages that tell a learner nothing, silenced where they start.

Each one is true, and none says anything about the learner's program. They are turned off
with the switch their own library offers, in the ranks this package starts on this machine
(``spawn`` and ``run``), by a filter on the library's own logger in the notebook's kernel,
and never in the kernel's environment, which ``sbatch`` passes on to jobs (a login node
without a GPU must not tell a GPU job what it lacks). ``helpers.training.profiling`` quiets
the profiler in the kernel for the length of a profile:

    KINETO_LOG_LEVEL=6   torch.profiler's backend prints "USDT ... profiler_start" and
                         "profiler_stop" each time a profile starts and stops, and an ERROR
                         when a CUDA build finds no GPU. Its trace lines rank above its errors,
                         so no level keeps one without the other; 6 is above them all. The
                         profiler's results are the same.
    DS_ACCELERATOR=cpu   (no NVIDIA GPU here) DeepSpeed warns "Setting accelerator to CPU. If
                         you have GPU or other accelerator, we were unable to detect it" when it
                         has to guess; told, it does not guess.
    TORCH_LOGS=-torch.utils.cpp_extension   (no NVIDIA GPU here) "No CUDA runtime is found,
                         using CUDA_HOME=..." when DeepSpeed builds its CPU operators on a machine
                         with a CUDA toolkit and no GPU, where CUDA plays no part.
    PYTHONWARNINGS       two FutureWarnings by their exact text: torch 2.14 renamed
                         ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (``*_single``),
                         and DeepSpeed still calls the old names in its ZeRO stages. torch
                         attributes the warning to its own logging wrapper whatever the caller,
                         so no filter can tell DeepSpeed's calls from a learner's: these two
                         renames (which notebook 02 teaches) are dropped, every other
                         FutureWarning stays.

What a learner should see stays: warnings from their own code, FutureWarnings (a deprecated
call in the workbook is a bug to fix, not to hide), every error. A value the user has set is
never replaced. DeepSpeed also prints "DeepSpeed ... shm_comm_op built successfully" with a bare
``print`` when its CPU shared-memory collectives load: it has no switch, so ``helpers.launch.run``
keeps that line in the rank's log and does not echo it (``UNECHOED``, read by
helpers.launch.supervise).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

__all__ = ["UNECHOED", "has_nvidia_gpu", "rank_environment", "quiet_kernel"]

# What each silenced message starts with, per logger: only these records are dropped.
_NO_GPU_RECORDS = {
    "DeepSpeed": "Setting accelerator to CPU",
    "torch.utils.cpp_extension": "No CUDA runtime is found",
}


# Rank output lines that no switch turns off: kept in the rank's log, not echoed live.
UNECHOED = re.compile(r"^DeepSpeed [\w.]+ built successfully$")  # DeepSpeed's CPU shm collectives

# PYTHONWARNINGS entries: action:message (the start of the text, literally):category
_RENAMED_COLLECTIVES = ",".join(
    f"ignore:`torch.distributed.{name}` is deprecated:FutureWarning"
    for name in ("all_gather_into_tensor", "reduce_scatter_tensor")
)


def has_nvidia_gpu() -> bool:
    """Whether this machine has an NVIDIA driver's device files, without touching CUDA.

    Asking torch (``torch.cuda.is_available()``) would initialise CUDA in a process that
    later forks ranks, which CUDA does not allow.
    """
    return Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists()


def rank_environment(environ: dict | None = None) -> dict[str, str]:
    """The variables to add for ranks started on this machine (only those not set already)."""
    env = os.environ if environ is None else environ
    out = {"KINETO_LOG_LEVEL": "6", "PYTHONWARNINGS": _RENAMED_COLLECTIVES}
    if not has_nvidia_gpu():
        out["DS_ACCELERATOR"] = "cpu"
        out["TORCH_LOGS"] = "-torch.utils.cpp_extension"
    return {k: v for k, v in out.items() if k not in env}


class _DropRecord(logging.Filter):
    def __init__(self, starts_with: str):
        super().__init__()
        self.starts_with = starts_with

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts_with)


def quiet_kernel() -> None:
    """In this process (a notebook's kernel), on a machine without an NVIDIA GPU: the two
    records above, dropped by a filter on the logger that emits them. No variable is set."""
    if has_nvidia_gpu():
        return
    for name, starts_with in _NO_GPU_RECORDS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRecord) for f in logger.filters):
            logger.addFilter(_DropRecord(starts_with))
