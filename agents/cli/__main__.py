"""`python -m agents.cli`: the `freshplan` command."""

import sys

from agents.cli.main import main

sys.exit(main())
