import sys

from helpers.course.book.runner import main

sys.exit(main())
