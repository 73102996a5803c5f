"""The course's subject: one module per parallelism technique.

Each module holds the technique's hand-written core (what the course teaches)
and its thin wrappers around the torch API that does the same in production.
"""
