"""Pipeline parallelism: a model cut into stages, micro-batches flowing through them.

Real pipelines with torch.distributed.pipelining (pipeline), what they did on each rank
(pipeline_measure), Llama 2 cut into stages (pipeline_llama), and the schedules (GPipe,
1F1B, interleaved, zero bubble) with an event simulator (schedules). Notebook 05 teaches
them (notebook 08 pipelines CoAtNet with them); lab 3 asks for micro-batching and a
schedule, and refuses importing pipeline and schedules.
"""
