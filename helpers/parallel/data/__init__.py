"""Data parallelism: every rank holds the whole model and averages its gradients.

Gradient averaging by hand and torch's DDP (ddp), DDP's buckets made visible (buckets),
one asynchronous all-reduce per parameter (overlap_ddp), then size-capped buckets
(bucketed_ddp), what is in flight during backward (ddp_timeline), parameters that get no
gradient (unused), the order buckets leave in and what a bucket size costs (bucket_order),
compression hooks (compression), weak and strong scaling (scaling), and federated averaging
(federated). Notebooks 03 and 03b teach them; lab 6
asks for DDP by hand and refuses importing this family's DDP modules.
"""
