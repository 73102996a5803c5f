"""Course tools that no training program imports, one folder a tool.

    book/       the book runner (papermill), its headless engine, the notebooks' kernel
    grading/    lab release and grading (nbgrader): the guard and its refusals, the
                traffic recorder (recorder/), the checks per lab (checks/)
    hub/        the workshop hub: JupyterHub with each learner's JupyterLab a Slurm job
    dryrun/     every job the notebooks write, checked as a GPU cluster would run it
    gpucheck/   the same jobs on real GPUs, with their figures recorded
    floor/      the torch 2.6 floor: names newer than the oldest supported torch
    bench/      benchmarks that print figures (python -m helpers.course.bench NAME)

scaling_study.py (notebook 03's weak and strong scaling study, printed by ``bench ddp``)
stays beside them: every module of bench/ is a benchmark name.
"""
