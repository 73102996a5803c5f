"""Context parallelism: the sequence split over the ranks, attention across them.

Attention one block of keys at a time with its log-sum-exp, and the merge
(online_softmax), which tokens each rank holds (context_layout), ring attention with K/V
travelling round the ranks (ring_attention, and on torch's fused kernels:
fused_ring_attention), all-gathered K and V (allgather_attention) and the all-to-all over
the heads of DeepSpeed-Ulysses (ulysses); context_layout also holds the striped layout and
the document mask notebook 09 compares the ring's layouts with. Notebook 09
teaches them; lab 7 asks for a ring by hand and refuses importing every module here.
"""
