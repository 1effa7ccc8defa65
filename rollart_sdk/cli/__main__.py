"""``python -m rollart_sdk.cli``: the same as the ``rollart`` command."""

import sys

from rollart_sdk.cli import main

sys.exit(main())
