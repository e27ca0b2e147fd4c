"""``python -m seqae``: the ``seqae`` command, as Ray Jobs and the tests run it."""

import sys

from seqae.cli.main import main

sys.exit(main())
