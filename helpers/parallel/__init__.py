"""The course's subject: one folder per family of parallelism, one module per technique.

    collectives/  the messages every family is built from, and what they cost   (notebook 02)
    data/         data parallelism: DDP by hand and torch's, buckets, FedAvg     (notebooks 03, 03b)
    sharded/      ZeRO and FSDP: what each rank keeps, memory, checkpoints        (notebook 04)
    pipeline/     pipeline stages and their schedules                            (notebook 05)
    tensor/       tensor (and sequence) parallelism, Megatron-style              (notebook 06)
    context/      context parallelism: ring and all-gather attention             (notebook 09)
    expert/       expert parallelism: a mixture of experts, all-to-all dispatch  (notebook 10)
    composed/     families combined: meshes, plans for Llama 2 and CoAtNet,
                  the layout planner                                          (notebooks 07, 08)

Each module holds the technique's hand-written core (what the course teaches)
and its thin wrappers around the torch API that does the same in production.
A family may use collectives/; composed/ may use every family (pyproject.toml's
import-linter contracts say which family may import which).
"""
