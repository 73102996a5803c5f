import sys

from helpers.course.hub.workshop import main

sys.exit(main())
