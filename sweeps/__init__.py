"""The sweep service, in four rooms, each importing only the rooms before it:

- :mod:`sweeps.spec`: the sweep file, checked before anything is created;
- :mod:`sweeps.stores`: what keeps a sweep (its workspace folder, the Optuna study, MLflow);
- :mod:`sweeps.running`: running it (the driver, Ray Tune's side, a trial in its worker);
- :mod:`sweeps.results`: reading what it found (status, the trials' table, the registered model).

It imports neither the report (:mod:`dashboards`) nor :mod:`seqae` above it: :mod:`seqae.api`, the
one door from Python and the command line, hands the driver the report it writes.

Importing it sets seqae's MLflow client settings in the environment, unless the user set them,
before any of its modules imports MLflow (which reads its logging level at import) and before Ray
starts (its workers inherit them): a failed request comes back to the writer's own retry loop
quickly instead of blocking for minutes; no telemetry, no progress bars, no INFO chatter between
the sweep's progress lines."""

import os

for _key, _value in (
    ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1"),
    ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
    ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20"),
    ("MLFLOW_DISABLE_TELEMETRY", "true"),
    ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"),
    ("MLFLOW_LOGGING_LEVEL", "WARNING"),
):
    os.environ.setdefault(_key, _value)
