"""A sweep's MLflow runs, read a page at a time: one search returns at most one page
(``max_results``), and a sweep of 10,000 trials has 10,001 runs. The report and the sweep service
(export, tracking) read them through here."""

from __future__ import annotations

from collections.abc import Iterator

from mlflow.entities import Run, ViewType
from mlflow.tracking import MlflowClient

PAGE = 1000  # runs per search: MLflow's default page size


def all_runs(
    client: MlflowClient, experiment_id: str, filter_string: str = "", view: int = ViewType.ACTIVE_ONLY
) -> Iterator[Run]:
    """Every run of the experiment that matches ``filter_string`` (``view``: the deleted ones too, or only them)."""
    token = None
    while True:
        page = client.search_runs(
            [experiment_id], filter_string=filter_string, max_results=PAGE, page_token=token, run_view_type=view
        )
        yield from page
        token = page.token
        if not token:
            return
