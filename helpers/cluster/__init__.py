"""Slurm: cluster profiles, job scripts, and the Job object (submit, follow, collect).

    from helpers.cluster import Job
    job = Job("allreduce", "programs/allreduce.py", nodes=2, gpus_per_node=4, profile="engaging")
    job.submit(); job.wait(); job.result()

No IPython in here: the ``%%sbatch`` cell magic lives in helpers.notebook.
"""

from helpers.cluster.job import Job
from helpers.cluster.profiles import ProfileError, load_profile, profile_names
from helpers.cluster.slurmcli import slurm_available

__all__ = ["Job", "ProfileError", "load_profile", "profile_names", "slurm_available"]
