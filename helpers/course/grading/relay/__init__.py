"""The relay process group: the ranks' collectives and messages pass through the grading process.

Under the grader's sandbox a rank has one socket to the grading process and no other way to
reach its peers. backend.py makes that socket the rank's ``torch.distributed`` backend
("relay": ``connect(fd, rank, world_size)``); switch.py serves the other ends in the
grading process (``RelaySwitch(socks)``): it matches and computes every collective
(ops.py), delivers every message, and records each of them, per rank, into the EventLog
open there, refusing and tampering as the rank's open recording says (marks.py; the rank
sends its markers with markers.py). frames.py is the wire format (a JSON header and raw
bytes: nothing a rank sends is unpickled); channel.py is the rank's end of the socket.
"""
