"""The workbook's torch version floor, tested: ``check`` (every torch name a learner or a job
runs exists in the floor's torch), ``sources`` (what it reads), ``release`` (a torch release's
API surface, read from its wheel; the floor's is committed here as torch-2.6.json.gz).

    python -m helpers.course.floor check                  # the offences, one a line
    python -m helpers.course.floor build-manifest WHEEL   # rewrite the floor's manifest
"""

from helpers.course.floor.check import GUARD, Offence, check, main
from helpers.course.floor.sources import Source, workbook_sources

__all__ = ["GUARD", "Offence", "Source", "check", "main", "workbook_sources"]
