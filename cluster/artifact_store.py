"""Where the MLflow server of `seqae cluster services` keeps its artifacts: beside the team's
storage, a folder under a folder or a URI under a URI (``s3://BUCKET/prefix/mlartifacts``). For
an ``s3://`` storage the server needs boto3 and credentials that reach the bucket; both are
checked before anything starts, since the server answers its health check either way and only
the artifacts written later would fail."""

from __future__ import annotations

import os
from pathlib import Path

from seqae_errors import ConfigError, one_line

FOLDER = "mlartifacts"


def artifact_root(storage: str) -> str:
    """MLflow's artifact root inside ``storage`` (a path, or a URI such as ``s3://bucket/prefix``)."""
    if "://" in storage:
        return f"{storage.rstrip('/')}/{FOLDER}"
    return str(Path(storage) / FOLDER)


def check(storage: str) -> None:
    """Refuse an ``s3://`` storage that the server, which runs with this process's environment,
    could not use: boto3 not installed, or the bucket not listable with these AWS credentials
    (MLflow lists a run's artifacts to show them, and a refused listing also means a wrong
    bucket, endpoint or key). Other storages are not checked."""
    if not storage.startswith("s3://"):
        return
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise ConfigError(
            f"--storage {storage}: MLflow keeps its artifacts in S3 through boto3, which is not "
            'installed; install seqae\'s s3 extra (pip install -e ".[s3]")'
        ) from None
    bucket = storage.removeprefix("s3://").split("/", 1)[0]
    # MLflow's S3 client takes its endpoint from MLFLOW_S3_ENDPOINT_URL, else boto3's own settings
    client = boto3.client(
        "s3",
        endpoint_url=os.environ.get("MLFLOW_S3_ENDPOINT_URL") or None,
        config=Config(connect_timeout=10, read_timeout=30, retries={"max_attempts": 2}),
    )
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=artifact_root(storage).removeprefix(f"s3://{bucket}/"), MaxKeys=1)
    except (BotoCoreError, ClientError) as exc:
        raise ConfigError(
            f"--storage {storage}: MLflow's artifacts cannot go there: listing it with this machine's "
            f"AWS credentials failed ({one_line(exc)}); check the bucket's name and the credentials "
            "(AWS_PROFILE, AWS_ACCESS_KEY_ID, an instance profile), which must list and write it"
        ) from None
