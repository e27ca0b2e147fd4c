"""What keeps a sweep: its workspace folder (:mod:`.workspace`), its Optuna study (:mod:`.search`,
behind :mod:`.study_storage`'s retries) and the outcomes the study records (:mod:`.ledger`), the
checkpoints it keeps (:mod:`.retention`), and MLflow (:mod:`.tracking`, written through
:mod:`.writer`, read through :mod:`.mlflow_runs`, guarded by :mod:`.mlflow_access`); how an absent
service is waited out (:mod:`.outages`)."""
