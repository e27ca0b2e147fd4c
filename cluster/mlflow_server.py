"""An MLflow tracking server bound to loopback, with the security defaults seqae keeps: only
loopback Host headers are accepted (a foreign Host gets 403, against DNS rebinding) and only the
server's own origin may write across origins (other cross-origin writes get 403)."""

from __future__ import annotations

import sys
from pathlib import Path

from cluster.procs import http_ok, spawn, wait_until


def argv(backend_uri: str, artifacts: str, port: int, host: str = "127.0.0.1") -> list[str]:
    origins = ",".join(f"http://{h}:{port}" for h in ("127.0.0.1", "localhost"))
    return [
        sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
        "--artifacts-destination", artifacts, "--serve-artifacts", "--host", host, "--port", str(port),
        "--workers", "1", "--allowed-hosts", f"127.0.0.1:{port},localhost:{port}",
        "--cors-allowed-origins", origins,
    ]


def start(backend_uri: str, artifacts: str, port: int, log: Path, env: dict[str, str] | None = None,
          host: str = "127.0.0.1", timeout: float = 120) -> int:
    """Start the server in its own session and wait until it answers; returns its pid."""
    Path(artifacts).mkdir(parents=True, exist_ok=True)
    pid = spawn(argv(backend_uri, artifacts, port, host), log,
                env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true", **(env or {})})
    wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), timeout, f"the MLflow server on port {port}", log)
    return pid
