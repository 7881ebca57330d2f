"""``python -m tests.sim``: see run.py."""

import sys

from .run import main

sys.exit(main())
