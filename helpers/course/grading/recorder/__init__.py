"""The traffic recorder: what each rank sends, receives and allocates, for the lab tests.

traffic.py records a rank's collectives and messages (c10d.py: torch.distributed's
operators), streams each event to the grading process (events.py), changes a message on
its way (tamper.py), and counts the bytes a rank allocates (allocations.py). Every lab's
tests use it, and notebooks 04 and 09 show a rank's traffic with it.
"""
