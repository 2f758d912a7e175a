import sys

from hooktrace.cli import main

sys.exit(main())
