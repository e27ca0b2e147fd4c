"""The sweep service: a sweep file checked (:mod:`sweeps.spec`), its trials run by Ray Tune and
searched by Optuna (:mod:`sweeps.driver`), tracked in MLflow; from Python, :mod:`sweeps.api`.

Importing it sets seqae's MLflow client settings in the environment, unless the user set them,
before any of its modules imports MLflow (which reads its logging level at import) and before Ray
starts (its workers inherit them): a failed request comes back to the writer's own retry loop
quickly instead of blocking for minutes; no telemetry, no progress bars, no INFO chatter between
the sweep's progress lines."""

import os

for _key, _value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                     ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20"), ("MLFLOW_DISABLE_TELEMETRY", "true"),
                     ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"), ("MLFLOW_LOGGING_LEVEL", "WARNING")):
    os.environ.setdefault(_key, _value)
