"""Collectives: the messages every parallelism is made of, and what they cost.

Ring all-reduce and a parameter server by hand (collectives), the alpha-beta cost model
fitted to a ping-pong (costmodel), and published NCCL measurements to hold it against
(published_comm). Notebook 02 teaches them; labs 0 and 1 ask for an all-reduce and a
ring by hand, and refuse importing collectives.
"""
