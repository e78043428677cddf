"""``python3 -m lendbox``: the ``lendbox`` command (lendbox.cli) without installing it."""

import sys

from .cli import main

sys.exit(main())
