import sys

from helpers.course.floor.check import main

sys.exit(main())
