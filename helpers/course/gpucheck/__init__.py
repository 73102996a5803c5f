"""``make gpu-check``: the workbook's GPU world, run on real GPUs, with its figures recorded.

    python -m helpers.course.gpucheck --plan        # what it would run here, and what is missing
    python -m helpers.course.gpucheck [--jobs build/dryrun/runs] [--out build/gpu-check]

For an instructor, on one GPU node of the site, before a workshop (docs/instructors.md,
"Check the GPU world"). It needs only the site's PyTorch and the workbook installed with
``pip install --no-deps -e .``; what else an item needs (DeepSpeed, papermill) it names, with
the ``pip download`` lines that fetch it. It runs, one at a time, each in its own process
session under its own time limit, writing ``<out>/<gpu>-<date>.json`` (and .md) after each:

1. every distinct job program the notebooks write (the directories ``make dryrun`` leaves in
   build/dryrun/runs), at the job's own arguments on min(its world size, the GPUs here)
   ranks, stopped after 20 optimizer steps; a job whose layout needs more GPUs than the node
   has is "needs N GPUs", not a failure (plan.py, needs.py);
2. the measurements notebooks 01, 02 and 07 show beside their CPU figures: the CNN's
   samples/s in fp32 and bf16, all-reduce bus bandwidth by message size, Llama 2 tokens/s
   and MFU;
3. notebook 01 on CUDA (full mode).

Each row says where its time went: start-up, imports, the process group (NCCL), DeepSpeed's
op compile, the first forward and step, the steady step (probe.py, supervise.py). Commit
the JSON as ``notebooks/data/gpu/``: ``show``, ``figure`` and ``label`` (record.py) print
its figures in the notebooks, labelled with the GPU, the date and the torch version.
"""

from helpers.course.gpucheck.check import FIGURES_ENV, hardware, main
from helpers.course.gpucheck.plan import MEASUREMENTS
from helpers.course.gpucheck.record import figure, keep, label, measured, recorded, show

__all__ = ["main", "hardware", "recorded", "show", "figure", "label", "measured", "keep",
           "MEASUREMENTS", "FIGURES_ENV"]  # fmt: skip
