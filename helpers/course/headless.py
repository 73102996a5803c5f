"""Papermill without a browser's part in widgets: the engine ``book.execute`` runs notebooks with.

nbclient plays a browser for one widget, ``ipywidgets.Output``: when a cell opens one, the
client answers each captured output with a ``comm_msg`` on the kernel's shell channel, while
the cell still runs. With ipykernel 7 such a message, arriving as the kernel sends its own
on the same socket, can strand the shell channel (nbclient issue #312, ipykernel #1554):
the kernel sits idle, the cell's request unread, until the cell's timeout. Measured here on
a notebook of 40 ``vp.explorer`` cells under a bursty load on both cores: one cell in about
fifteen hung for the whole timeout (15 s each time); ``make test``'s 1,800 s would be lost.

This engine leaves the widget unplayed. The outputs an ``Output`` widget captures still
reach the cell, as the kernel publishes them, so the executed notebook shows the chart a
learner's explorer draws first; nothing is sent to the kernel while a cell runs.
"""

from __future__ import annotations

NAME = "workbook-headless"


def _client_class():
    from papermill.clientwrap import PapermillNotebookClient

    class HeadlessClient(PapermillNotebookClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.widget_registry = {}  # no Output-widget mimic: never write to the shell mid-cell

    return HeadlessClient


def register() -> str:
    """Register the engine with papermill (idempotent); returns its name for ``engine_name``."""
    from papermill.engines import NBClientEngine, papermill_engines
    from papermill.log import logger

    client = _client_class()

    class HeadlessEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None,
                                     stderr_file=None, start_timeout=60, execution_timeout=None,
                                     **kwargs):  # fmt: skip
            # As NBClientEngine does, with the client above.
            kwargs.pop("input_path", None)
            kwargs.pop("startup_timeout", None)
            timeout = execution_timeout or kwargs.pop("timeout", None)
            kwargs.pop("timeout", None)
            return client(nb_man, timeout=timeout, startup_timeout=start_timeout,
                          kernel_name=kernel_name, log=logger, log_output=log_output,
                          stdout_file=stdout_file, stderr_file=stderr_file, **kwargs).execute()  # fmt: skip

    papermill_engines.register(NAME, HeadlessEngine)
    return NAME
