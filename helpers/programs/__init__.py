"""Standalone programs the notebooks launch; each runs with python, torchrun or srun.

python -m helpers.programs.train_ddp --epochs 2            # one process
torchrun --nproc-per-node 4 helpers/programs/train_ddp.py  # four ranks
"""
