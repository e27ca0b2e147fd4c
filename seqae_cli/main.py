"""The ``seqae`` command: ``main`` parses the arguments, sets MLflow's environment and runs the
verb; a user's mistake (:class:`ConfigError`) is one line on stderr and exit code 2, a database
that stayed away (:class:`StorageUnreachable`) one line and exit code 75."""

from __future__ import annotations

import logging
import os
import signal
import sys

from seqae_cli.parser import build_parser
from seqae_errors import ConfigError, StorageUnreachable

EXIT_USAGE = 2  # bad input: the same code argparse uses
EXIT_TEMPFAIL = 75  # a service away: try again later (sysexits.h's EX_TEMPFAIL)



def mlflow_environment() -> None:
    """seqae's MLflow client settings, unless the user set them, in the environment before
    anything imports MLflow (it reads its logging level at import) and before Ray starts (its
    workers inherit it): a failed request comes back to the writer's own retry loop quickly
    instead of blocking for minutes; no telemetry, no progress bars, no INFO chatter between the
    sweep's progress lines."""
    for key, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                       ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20"), ("MLFLOW_DISABLE_TELEMETRY", "true"),
                       ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"), ("MLFLOW_LOGGING_LEVEL", "WARNING")):
        os.environ.setdefault(key, value)



def main(argv: list[str] | None = None) -> int:
    # A shell that starts a command in the background makes it ignore SIGINT, and Python then
    # installs no KeyboardInterrupt for it; a sweep driver and `seqae ui` stop cleanly on SIGINT
    # (and SIGTERM, which they turn into one), wherever they were started from.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    mlflow_environment()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
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
