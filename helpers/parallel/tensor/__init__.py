"""Tensor parallelism: each layer's weights split over the ranks (Megatron-LM).

Column- and row-parallel layers (tp) and Megatron's f and g operators (tp_comm), the
input-gradient all-reduce overlapped with dW (tp_async), sequence parallelism (tp_sp),
the vocabulary split (tp_vocab), what a rank holds (tp_memory), and a small decoder
with greedy generation over a head-sharded KV cache (tp_inference). Notebook 06 teaches
them; lab 4 asks for column- and row-parallel layers and refuses importing tp, tp_comm
and tp_inference.
"""
