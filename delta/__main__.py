"""Entry point for `python -m delta`."""

import sys

from .cli import main

sys.exit(main())
