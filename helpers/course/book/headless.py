"""Papermill without a browser's part in widgets: the engine ``book.execute`` runs notebooks with.

nbclient plays a browser for one widget, ``ipywidgets.Output``: when a cell opens one, the
client answers each captured output with a ``comm_msg`` on the kernel's shell channel, while
the cell still runs. With ipykernel 7 such a message, arriving as the kernel sends its own
on the same socket, can strand the shell channel (nbclient issue #312, ipykernel #1554):
the kernel sits idle, the cell's request unread, until the cell's timeout. Measured here on
a notebook of 40 ``vp.explorer`` cells under a bursty load on both cores: at least 13 of 280
cells hung for the whole timeout (15 s each time); ``make test``'s 1,800 s would be lost.

This engine leaves the widget unplayed. The outputs an ``Output`` widget captures still
reach the cell, as the kernel publishes them, so the executed notebook shows the chart a
learner's explorer draws first; nothing is sent to the kernel while a cell runs.
"""

from __future__ import annotations

import functools

NAME = "workbook-headless"


@functools.cache
def register() -> str:
    """Register the engine with papermill, once; returns its name for ``engine_name``."""
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines
    from papermill.log import logger

    class HeadlessClient(PapermillNotebookClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.widget_registry = {}  # no Output-widget mimic: never write to the shell mid-cell

    class HeadlessEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None,
                                     stderr_file=None, start_timeout=60, execution_timeout=None,
                                     **kwargs):  # fmt: skip
            # NBClientEngine's own method, with HeadlessClient for PapermillNotebookClient.
            timeout = kwargs.pop("timeout", None)
            for unused in ("input_path", "startup_timeout"):
                kwargs.pop(unused, None)
            return HeadlessClient(nb_man, timeout=execution_timeout or timeout,
                                  startup_timeout=start_timeout, kernel_name=kernel_name, log=logger,
                                  log_output=log_output, stdout_file=stdout_file,
                                  stderr_file=stderr_file, **kwargs).execute()  # fmt: skip

    papermill_engines.register(NAME, HeadlessEngine)
    return NAME
