"""The per-lab "by hand" checks, built on the recorder: how a learner's code works.

ring_check.py: lab 1's ring all-reduce; ddp_check.py and ddp_watch.py: lab 6's DDP by
hand; ring_attention_check.py: lab 7's ring attention.
"""
