"""Notebook glue: the cell magics that ``%load_ext helpers`` registers.

%%program NAME      write the cell to programs/NAME.py and run it in the kernel too
%%torchrun -n 4 NAME   write the cell to programs/NAME.py and torchrun it locally
%%sbatch NAME ...   write the cell to programs/NAME.py and submit it as a Slurm job
"""
