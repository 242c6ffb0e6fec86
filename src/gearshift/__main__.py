"""`python -m gearshift ...`: the `gearshift` command (for an environment whose scripts are not on PATH)."""

import sys

from gearshift.cli.main import main

sys.exit(main())
