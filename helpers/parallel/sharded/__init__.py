"""Sharded data parallelism: ZeRO stages and FSDP, where each rank keeps a share.

ZeRO stages side by side (zero), FSDP2's fully_shard and what it sends (fsdp), FSDP from
all-gather and reduce-scatter by hand (fsdp_by_hand) in FSDP1's flat layout or FSDP2's
per-parameter rows (shard_layout), CPU offload (offload), the bytes a
rank holds, predicted and measured (memory), and checkpoints written by every rank and
resumed from (checkpoint, also notebook 03's preemption). Notebook 04 teaches them; lab 2
asks for ZeRO by hand and refuses importing zero, fsdp, fsdp_by_hand, shard_layout and memory.
"""
