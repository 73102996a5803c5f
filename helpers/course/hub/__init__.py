"""The workshop hub: JupyterHub on the cluster, each learner's JupyterLab a Slurm job.

    python -m helpers.course.hub check      # what would stop a class from working

workshop.py: the hub's settings, class list, job script and configuration (read by
slurm/hub/jupyterhub_config.py); job.py: what runs inside a learner's JupyterLab job;
spawner.py: batchspawner's port callback. docs/instructors.md, section 7.
"""
