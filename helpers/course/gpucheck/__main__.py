"""``python -m helpers.course.gpucheck``: see the package's docstring."""

import sys

from helpers.course.gpucheck.check import main

sys.exit(main())
