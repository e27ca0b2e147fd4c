"""``python -m seqae_cli``: the ``seqae`` command, as Ray Jobs and the tests run it."""

import sys

from seqae_cli.main import main

sys.exit(main())
