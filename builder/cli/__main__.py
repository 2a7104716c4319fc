"""`python -m builder.cli`."""

import sys

from builder.cli.main import main

sys.exit(main())
