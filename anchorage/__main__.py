"""`python -m anchorage` is the `anchorage` command."""

import sys

from anchorage.cli import main

sys.exit(main())
