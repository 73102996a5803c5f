"""Helpers for the Parallel & Distributed Deep Learning workbook.

Modules are named by concept and imported explicitly, e.g.::

    from helpers import dist, launch
    from helpers.config import parse

``%load_ext helpers`` registers the notebook magics (%%torchrun, %%sbatch).
"""

__version__ = "0.1.0"


def load_ipython_extension(ipython):  # pragma: no cover - exercised by notebooks
    from helpers.notebook import magics

    magics.register(ipython)
