"""The families composed: a job's parallel degrees, and plans that combine them.

The named DeviceMesh of (pp, dp, tp) (mesh), FSDP + TP for Llama 2 (llama_parallel), CoAtNet
pipelined and tensor-parallel (coatnet_parallel), the layout planner with its rules and its
check against measurement (planner, plancost, plancheck), layouts run for real (layouts),
and a cluster-sized layout checked in one process (simulate). Notebooks 07 and 08 teach
them; lab 5 asks for a mesh, a plan and a layout chooser and refuses importing mesh,
llama_parallel, planner, simulate and coatnet_parallel. This family may use every other.
"""
