"""`python -m idled.cli ...`: the same as `idled ...`."""

import sys

from idled.cli.main import main

sys.exit(main())
