"""The ``seqae`` command: ``main`` parses the arguments and runs the verb (importing :mod:`sweeps`
set MLflow's environment); a user's mistake (:class:`ConfigError`) is one line on stderr and exit
code 2, a database that stayed away (:class:`StorageUnreachable`) one line and exit code 75."""

from __future__ import annotations

import logging
import signal
import sys

from seqae.api import show_progress
from seqae.cli.parser import build_parser
from seqae_errors import ConfigError, StorageUnreachable

EXIT_USAGE = 2  # bad input: the same code argparse uses
EXIT_TEMPFAIL = 75  # a service away: try again later (sysexits.h's EX_TEMPFAIL)
OURS = ("seqae_errors", "seqae_core", "sweeps", "cluster", "dashboards", "benchmarks", "seqae")


def main(argv: list[str] | None = None) -> int:
    # A shell that starts a command in the background makes it ignore SIGINT, and Python then
    # installs no KeyboardInterrupt for it; a sweep driver and `seqae ui` stop cleanly on SIGINT
    # (and SIGTERM, which they turn into one), wherever they were started from.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = build_parser()
    args = parser.parse_args(argv)
    # seqae's own lines from INFO up; other libraries' only from WARNING up: their INFO lines
    # (matplotlib's "generated new fontManager", datasets' "JAX version ... available") are not
    # what the user asked for.
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    for package in OURS:
        logging.getLogger(package).setLevel(logging.INFO)
    show_progress()  # a sweep's driver prints its lines on stdout, as the verbs print theirs
    try:
        return int(args.handler(args) or 0)
    except ConfigError as exc:
        print(f"seqae: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StorageUnreachable as exc:
        print(f"seqae: error: {exc}", file=sys.stderr)
        return EXIT_TEMPFAIL
    except BrokenPipeError:  # `seqae sweep status x | head`: the reader has what it wanted
        sys.stderr.close()
        return 0
