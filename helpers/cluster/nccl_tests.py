"""A job script that runs NVIDIA's nccl-tests on a site's GPU nodes: ring against tree.

Notebook 02 checks its alpha-beta model against all-reduce bus bandwidths that others
published; the sites' own rows (Perlmutter's 4 A100 in a direct NVLink mesh, Jean Zay's 4 H100,
Slingshot between nodes) had none. This script measures them: ``all_reduce_perf`` from 8 B to
8 GiB on one node and on several, once with NCCL's ring forced and once with its tree
(``NCCL_ALGO``), and NCCL's own choice of algorithm and protocol per size in the log
(``NCCL_DEBUG_SUBSYS=INIT,TUNING``). What it records per size: time, algorithm bandwidth and bus
bandwidth for each algorithm, the "Avg bus bandwidth" line, and the links NCCL found.

    print(script("perlmutter", nodes=2, values={"account": "m1234_g"}))

The Slurm header and the modules come from the profile (``helpers.cluster.jobscript``), with one
task per GPU (nccl-tests built with MPI starts one process per GPU). Build nccl-tests once, on a
login node (compute nodes often have no internet), with the site's CUDA and MPI::

    git clone https://github.com/NVIDIA/nccl-tests ~/nccl-tests
    make -C ~/nccl-tests MPI=1 MPI_HOME=$MPI_HOME CUDA_HOME=$CUDA_HOME NCCL_HOME=$NCCL_HOME
"""

from __future__ import annotations

import re

from helpers.cluster.jobscript import JobSpec, render
from helpers.cluster.profiles import load_profile

__all__ = ["ALGORITHMS", "script"]

ALGORITHMS = ("Ring", "Tree")

_BODY = """set -eo pipefail

# ---- nccl-tests all_reduce_perf: {nodes} node(s) x {gpus} GPU(s), one process per GPU.
# Build it once on a login node (see helpers/cluster/nccl_tests.py); NCCL_DEBUG=INFO names the links
# NCCL found (NVLink, PCIe, NET/IB or NET/AWS Libfabric) and, with TUNING, the algorithm per size.
TESTS=${{NCCL_TESTS:-$HOME/nccl-tests/build}}
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING
echo "job $SLURM_JOB_ID on $SLURM_JOB_NUM_NODES node(s): $SLURM_JOB_NODELIST"
nvidia-smi topo -m    # NV# between two GPUs: # NVLinks directly; NV18 everywhere: an NVSwitch
for algo in {algorithms}; do
  # -b/-e: 8 B to 8 GiB, doubling (-f 2); -g 1: one GPU per process; -c 1: check the results
  NCCL_ALGO=$algo srun --ntasks-per-node={gpus} --gpus-per-task=1 \\
    "$TESTS/all_reduce_perf" -b 8 -e 8G -f 2 -g 1 -c 1 | tee "all_reduce_$algo.txt"
done
NCCL_DEBUG=WARN srun --ntasks-per-node={gpus} --gpus-per-task=1 \\
  "$TESTS/all_reduce_perf" -b 8 -e 8G -f 2 -g 1 | tee all_reduce_nccl_choice.txt
grep -h "Avg bus bandwidth" all_reduce_*.txt
"""


def script(profile: str, nodes: int = 1, gpus_per_node: int | None = None,
           values: dict | None = None) -> str:  # fmt: skip
    """The sbatch script: the profile's header with one task per GPU, then the nccl-tests runs."""
    prof = load_profile(profile)
    vals = prof.values(values or {})
    most, cpus_per_gpu = prof.node_facts(vals)
    gpus = gpus_per_node or most
    spec = JobSpec(name="nccl-tests", profile=prof, values=vals, nodes=nodes, gpus_per_node=gpus,
                   time="00:20:00")  # fmt: skip
    header = render(spec).split("set -eo pipefail", 1)[0]
    # One task per GPU (MPI ranks), each with its share of the node's CPUs.
    header = re.sub(r"--ntasks-per-node=1( *)#[^\n]*", f"--ntasks-per-node={gpus}\\1# one process per GPU (nccl-tests built with MPI)", header)  # fmt: skip
    header = re.sub(r"--cpus-per-task=\d+( *)#[^\n]*", f"--cpus-per-task={cpus_per_gpu}\\1# CPUs per GPU process", header)  # fmt: skip
    # The workbook's own check (`python -m helpers.compat`) needs the workbook: not here.
    lines = [line for line in header.splitlines() if "helpers.compat" not in line]
    header = "\n".join(lines).rstrip() + "\n\n"
    body = _BODY.format(nodes=nodes, gpus=gpus, algorithms=" ".join(ALGORITHMS))
    return header + body
