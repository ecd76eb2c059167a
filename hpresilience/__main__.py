"""`python -m hpresilience` runs the CLI."""

import sys

from hpresilience.cli import main

sys.exit(main())
