"""sweeps/results/status.py and ``sweeps.running.lifecycle.control``: what `seqae sweep status|list` show (trials by
state, the best, the cost against the budget, the control record) and what `seqae sweep stop|set`
write, for local sweeps and submitted ones, on a real Optuna study (SQLite in ``tmp_path``), real
checkpoint records and a real workspace folder. No Ray, no MLflow server and no training."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqae.cli.main import main
from seqae_core import metrics as M
from seqae_core.checkpoint import CheckpointStore
from seqae_errors import ConfigError
from sweeps.results.status import Cost, cost, status, trials_view
from sweeps.results.trials import read_trials
from sweeps.running import lifecycle
from sweeps.spec import sweep as spec_lib
from sweeps.spec.sections import MAX_CONCURRENT
from sweeps.stores.control_channel import Control
from sweeps.stores.ledger import decide, settle
from sweeps.stores.ownership import actor
from sweeps.stores.search import SweepStudy, open_study, read_only
from sweeps.stores.search import storage as optuna_storage
from sweeps.stores.workspace import Backends, Listed, SessionRecord, Submission, SweepState, Workspace, listing
from tests.conftest import WIKI_MINI
from tests.refusal import assert_refused
from tests.sweep_helpers import STUDIES, sets

QUICKSTART = STUDIES / "quickstart.yaml"
SETS = [f"data.path={WIKI_MINI}", "trials.total=5"]


def quickstart(*extra: str) -> spec_lib.SweepSpec:
    return spec_lib.load(QUICKSTART, [*SETS, *extra])


def write_records(storage: str, number: int, seconds: list[float], accuracy: float, finished: bool) -> None:
    """Trial ``number``'s epoch records, as training saves them: epoch e took ``seconds[e - 1]``."""
    store = CheckpointStore.of_trial(storage, number)
    history = [{M.EPOCH: e, M.VAL_TOKEN_ACCURACY: accuracy, M.EPOCH_SECONDS: s} for e, s in enumerate(seconds, 1)]
    for epoch in range(1, len(history) + 1):
        last = epoch == len(history)
        store.save_epoch(
            epoch,
            {"epoch": epoch, "weight": torch.zeros(2)},
            {"history": history[:epoch], "finished": finished and last, "patience_spent": False},
        )


def new_trial(study: SweepStudy) -> int:
    """Ask the study for its next trial, as a driver does; returns its number."""
    trial = study.next_trial()
    assert trial is not None, "the study planned no more trials"
    return trial.number


def run_trials(study: SweepStudy, storage: str, plans: list[tuple[list[float], float, bool | None]]) -> list[int]:
    """One trial per plan ``(epoch seconds, accuracy, finished)``, ended as the ledger decides from its
    records (``finished=None``: still running). Returns their numbers."""
    numbers = []
    for seconds, accuracy, finished in plans:
        number = new_trial(study)
        if seconds:
            write_records(storage, number, seconds, accuracy, bool(finished))
        if finished is not None:
            progress = CheckpointStore.of_trial(storage, number).progress()
            settle(study, number, decide(progress, error=False), progress)
        numbers.append(number)
    return numbers


def write_sweep(
    workspace: Workspace, name: str, spec: spec_lib.SweepSpec, sessions: list[SessionRecord] | None = None
) -> SweepState:
    """A local sweep's ``sweep.json``, with the workspace's own backends, as `seqae sweep run` records it."""
    state = SweepState(
        name=name,
        spec=spec,
        fingerprint=spec.fingerprint(),
        file=str(QUICKSTART),
        sets=SETS,
        planned_trials=spec.planned_trials(),
        backends=workspace.default_backends(name),
        study_name=name,
        sessions=sessions or [],
    )
    if sessions:  # a driver has run: it created the sweep's MLflow database
        Path(state.backends.mlflow_tracking_uri.removeprefix("sqlite:///")).touch()
    workspace.write(state)
    return state


def start_sweep(workspace: Workspace, state: SweepState) -> SweepStudy:
    """The sweep's study, as its first driver creates it."""
    spec = state.spec
    return open_study(spec, state.backends.optuna_storage, state.study_name, state.total_trials, state.fingerprint)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty Optuna database with its tables created (a fraction of a second each on SQLite):
    each test's databases start as copies of it."""
    path = tmp_path_factory.mktemp("template") / "optuna.db"
    optuna_storage(f"sqlite:///{path}")
    return path


@pytest.fixture
def url(tmp_path: Path, template: Path) -> str:
    """A sweep's Optuna storage."""
    shutil.copy(template, tmp_path / "optuna.db")
    return f"sqlite:///{tmp_path / 'optuna.db'}"


@pytest.fixture
def workspace(tmp_path: Path, template: Path) -> Workspace:
    """A workspace whose sweeps keep their studies in its own ``optuna.db`` (the default backends)."""
    workspace = Workspace(tmp_path / "ws")
    workspace.root.mkdir()
    shutil.copy(template, workspace.root / "optuna.db")
    return workspace


# -- cost -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, unit, share, budget",
    [
        pytest.param(["resources.cpu=2", "budget.cpu_hours=1.5"], "cpu-hours", 2.0, 1.5, id="cpus-with-budget"),
        pytest.param(["resources.gpu=0.5", "budget.gpu_hours=3"], "gpu-hours", 0.5, 3.0, id="gpu-fraction-with-budget"),
        pytest.param([], "cpu-hours", 1.0, None, id="no-budget"),
    ],
)
def test_cost_counts_every_epoch_of_every_trial_times_its_share(tmp_path, url, extra, unit, share, budget):
    spec, storage = quickstart(*extra), str(tmp_path / "storage")
    assert spec.share == (unit.split("-")[0], share)
    study = open_study(spec, url, "cost", spec.planned_trials(), spec.fingerprint())
    run_trials(study, storage, [([900.0, 900.0], 0.6, True), ([450.0], 0.3, False), ([], 0.0, None)])

    spent = cost(spec, read_trials(spec, read_only(spec, url, "cost"), storage))

    assert spent.per_trial_seconds == {"0": 1800 * share, "1": 450 * share, "2": 0.0}
    assert spent.hours == pytest.approx(2250 * share / 3600)
    assert spent.unit == unit and spent.budget == budget


# -- trials_view ------------------------------------------------------------------------------
def test_trials_view_shows_trials_by_state_the_best_and_the_control_record(tmp_path, url):
    spec, storage = quickstart(), str(tmp_path / "storage")
    study = open_study(spec, url, "view", spec.planned_trials(), spec.fingerprint())
    numbers = run_trials(
        study,
        storage,
        [([10.0, 10.0, 10.0], 0.6, True), ([10.0, 20.0, 30.0], 0.8, True), ([10.0], 0.2, False), ([10.0], 0.4, None)],
    )
    study.set_control(drain="the objective's target is reached")
    backends = Backends("postgresql://seqae:secret@db:5432/mlflow", url, storage)

    view = trials_view(spec, backends, "view", spec.planned_trials())

    assert view.trials_total == 5
    assert view.trials_by_state == {"COMPLETE": 2, "PRUNED": 1, "RUNNING": 1, "NOT_STARTED": 1}
    records = read_trials(spec, read_only(spec, url, "view"), storage)
    assert view.best == (records[numbers[1]],) and view.starts == {"paper_lr": records[numbers[0]]}
    best, start = view.best[0], view.starts["paper_lr"]
    assert (best.number, best.state, best.values, best.params, best.test, best.seeds, best.start) == (
        numbers[1],
        "COMPLETE",
        {M.VAL_TOKEN_ACCURACY: 0.8},
        study.trials()[numbers[1]].params,
        None,
        None,
        "",
    )
    assert (start.number, start.state, start.values, start.test, start.seeds) == (
        numbers[0],
        "COMPLETE",
        {M.VAL_TOKEN_ACCURACY: 0.6},
        None,
        None,
    )
    # every epoch at 0.8: the first is kept; no MLflow was read
    assert (best.kept_epoch, best.last_epoch, best.cost_seconds, best.mlflow_run_id) == (1, 3, 60.0, "")
    assert view.proposed_by == {"start": 1, "random": 3}
    assert view.best[0].params.keys() == {"train.lr", "model.d_model", "model.d_attn"}
    assert view.control.drain == "the objective's target is reached"
    assert view.cost.per_trial_seconds == {"0": 30.0, "1": 60.0, "2": 10.0, "3": 10.0}
    assert view.objectives == ["val_token_accuracy (max)"]
    assert view.mlflow_tracking_uri == "postgresql://seqae:***@db:5432/mlflow"  # never the password
    assert (view.optuna_storage, view.optuna_study_name, view.storage) == (url, "view", storage)
    assert view.seeded_trials == 0


def test_trials_view_of_a_sweep_whose_study_does_not_exist_yet(tmp_path, url):
    spec = quickstart()
    view = trials_view(spec, Backends(f"sqlite:///{tmp_path}/mlflow.db", url, str(tmp_path)), "later", 5)
    assert view.trials_by_state == {"NOT_STARTED": 5}
    assert view.best == () and view.control == Control()
    assert view.cost == Cost("cpu-hours", 0.0, None, {})


# -- listing and status -----------------------------------------------------------------------
def test_listing_and_status_of_local_and_submitted_sweeps(workspace):
    spec = quickstart()
    sessions = [
        SessionRecord(1.0, 7, None, "h", "interrupted", trials={"COMPLETE": 1}),
        SessionRecord(2.0, 8, None, "h", "stopped", trials={"COMPLETE": 2, "PRUNED": 1}),
    ]
    alpha = write_sweep(workspace, "alpha", spec, sessions)
    storage = alpha.backends.storage
    numbers = run_trials(
        start_sweep(workspace, alpha), storage, [([5.0], 0.5, True), ([5.0, 5.0], 0.7, True), ([5.0], 0.1, False)]
    )
    write_sweep(workspace, "gamma", spec)  # recorded, never run
    workspace.write_submission(
        Submission(
            name="beta",
            address="http://head:8265",
            file="quickstart.yaml",
            sets=SETS,
            workspace="/cluster/ws",
            working_dir=str(STUDIES),
            jobs=["raysubmit_1"],
        )
    )

    assert listing(workspace) == [
        Listed("alpha", "stopped", 5, {"COMPLETE": 2, "PRUNED": 1}, str(QUICKSTART)),
        Listed("beta", "submitted", 0, {}, ""),
        Listed("gamma", "not started", 5, {}, str(QUICKSTART)),
    ]

    shown = status(workspace, "alpha")
    assert (shown.name, shown.workspace, shown.outcome, shown.sessions) == ("alpha", str(workspace.root), "stopped", 2)
    assert shown.trials_by_state == {"COMPLETE": 2, "PRUNED": 1, "NOT_STARTED": 2}
    assert [(b.number, b.values) for b in shown.best] == [(numbers[1], {M.VAL_TOKEN_ACCURACY: 0.7})]
    assert shown.cost.per_trial_seconds == {"0": 5.0, "1": 10.0, "2": 5.0}
    assert shown.optuna_storage == f"sqlite:///{workspace.root / 'optuna.db'}" and shown.storage == storage
    assert (shown.job, shown.forked_from, shown.mlflow_experiment_id) == (None, None, None)

    waiting = status(workspace, "gamma")
    assert waiting.outcome == "not started" and waiting.sessions == 0
    assert waiting.trials_by_state == {"NOT_STARTED": 5} and waiting.best == ()


# -- lifecycle.control ------------------------------------------------------------------------
def test_control_of_a_local_sweep_writes_the_record_into_its_study(workspace):
    state = write_sweep(workspace, "alpha", quickstart())
    start_sweep(workspace, state)
    spec, url = state.spec, state.backends.optuna_storage

    returned = lifecycle.control(workspace, "alpha", drain="stopped by `seqae sweep stop`")
    lifecycle.control(workspace, "alpha", max_concurrent=4)

    control = read_only(spec, url, "alpha").control()
    assert returned.drain == "stopped by `seqae sweep stop`"
    assert control.drain == "stopped by `seqae sweep stop`" and control.max_concurrent == 4
    assert [{k: v for k, v in entry.items() if k != "at"} for entry in control.log] == [
        {"by": actor(), "drain": "stopped by `seqae sweep stop`"},
        {"by": actor(), "max_concurrent": 4},
    ]


def test_control_refuses_an_unknown_sweep_a_limit_too_high_and_a_sweep_not_started(workspace):
    state = write_sweep(workspace, "alpha", quickstart())
    with pytest.raises(ConfigError, match="no sweep named 'nope'"):
        lifecycle.control(workspace, "nope", drain="stop")
    with pytest.raises(ConfigError, match="sweep 'alpha' has not started yet"):
        lifecycle.control(workspace, "alpha", drain="stop")

    start_sweep(workspace, state)
    too_many = MAX_CONCURRENT + 1
    with pytest.raises(ConfigError, match=f"max_concurrent={too_many:,} is above seqae's limit"):
        lifecycle.control(workspace, "alpha", max_concurrent=too_many)
    assert read_only(quickstart(), state.backends.optuna_storage, "alpha").control() == Control()  # nothing written


def test_the_control_verbs_refuse_in_one_line_what_they_cannot_change(tmp_path, capsys):
    """`seqae sweep set` changes max_concurrent only, within its limits; `stop` names the sweeps there."""
    for verb, says in (
        (["set", "nothing", "retries=2"], "max_concurrent=N only"),
        (["set", "nothing", "max_concurrent=0"], "at least 1"),
        (["set", "nothing", "max_concurrent=5000"], "max_concurrent=5,000 is above seqae's limit of 1,000"),
        (["stop", "nothing"], "no sweep named 'nothing'"),
    ):
        code = main(["sweep", *verb, "--workspace", str(tmp_path / "ws")])
        assert_refused(code, capsys.readouterr().err, says, created=(tmp_path / "ws" / "sweeps",))


@pytest.mark.parametrize(
    "environment",
    [
        pytest.param(None, id="storage-variable-unset"),
        pytest.param("elsewhere.db", id="storage-variable-names-another-storage"),
    ],
)
def test_control_of_a_submitted_sweep_uses_its_records_file_and_storage(
    tmp_path, url, workspace, monkeypatch, environment
):
    """The submission names the sweep file (relative to its working directory) and the study's
    storage: neither the current directory nor ``SEQAE_OPTUNA_STORAGE`` may change which."""
    source = tmp_path / "project"
    (source / "studies").mkdir(parents=True)
    shutil.copy(QUICKSTART, source / "studies" / "quick.yaml")
    workspace.write_submission(
        Submission(
            name="remote",
            address="http://head:8265",
            file="studies/quick.yaml",
            sets=SETS,
            workspace="/cluster/ws",
            working_dir=str(source),
            jobs=["raysubmit_1"],
            backends=Backends("http://mlflow:5000", url, "/cluster/ws/x"),
        )
    )
    spec = spec_lib.load(source / "studies" / "quick.yaml", SETS)
    open_study(spec, url, "remote", spec.planned_trials(), spec.fingerprint())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    if environment is None:
        monkeypatch.delenv("SEQAE_OPTUNA_STORAGE", raising=False)
    else:
        monkeypatch.setenv("SEQAE_OPTUNA_STORAGE", f"sqlite:///{tmp_path / environment}")

    lifecycle.control(workspace, "remote", drain="stopped by `seqae sweep stop`")
    lifecycle.control(workspace, "remote", max_concurrent=8)

    control = read_only(spec, url, "remote").control()
    assert control.drain == "stopped by `seqae sweep stop`" and control.max_concurrent == 8
    assert len(control.log) == 2


def test_control_of_a_submission_that_names_no_storage_says_it_has_not_started(workspace):
    workspace.write_submission(
        Submission(
            name="remote",
            address="http://head:8265",
            file="quickstart.yaml",
            sets=SETS,
            workspace="/cluster/ws",
            working_dir=str(STUDIES),
        )
    )
    with pytest.raises(ConfigError, match="sweep 'remote' has not started yet .*a storage its submission names"):
        lifecycle.control(workspace, "remote", drain="stop")


def test_reading_a_local_sweeps_status_loads_no_pytorch_mlflow_or_ray(workspace):
    """Their imports were most of `seqae sweep status`'s time (3.5 of 7 s at 10,000 trials,
    ``seqae bench control-plane``): the status of a local sweep, through the command line's own
    path, reads the Optuna study and the trials' records alone."""
    state = write_sweep(workspace, "light", quickstart())
    run_trials(start_sweep(workspace, state), state.backends.storage, [([2.0, 2.0], 0.5, True)])
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from seqae.cli.main import main; "
            f"code = main(['sweep', 'status', 'light', '--workspace', {str(workspace.root)!r}]); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'mlflow', 'ray', 'transformers'}), code)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert "COMPLETE 1" in loaded.stdout, loaded.stdout + loaded.stderr  # it read the sweep
    assert loaded.stdout.splitlines()[-1] == "[] 0", loaded.stdout + loaded.stderr


# -- warm_start -------------------------------------------------------------------------------
def test_a_warm_start_runs_each_earlier_sweeps_best_fitting_trials_first(workspace):
    """The earlier sweep ran at another latent length: its two best complete trials become starting
    points named after it, holding the values of the keys this sweep searches, after the file's own."""
    state = write_sweep(workspace, "at-25", quickstart())
    study = start_sweep(workspace, state)
    numbers = run_trials(
        study,
        state.backends.storage,
        [([1.0], 0.6, True), ([1.0], 0.9, True), ([1.0], 0.95, False), ([1.0], 0.8, True)],
    )
    spec = quickstart("model.latent_len=16", "warm_start={from: [at-25], top: 2}")
    warm = lifecycle.warm_starts(workspace, spec)
    trials = study.trials()
    assert list(warm) == [f"at-25.t{numbers[1]}", f"at-25.t{numbers[3]}"]  # the best two complete, best first
    assert warm[f"at-25.t{numbers[1]}"] == {k: trials[numbers[1]].params[k] for k in spec.sampling_order()}
    later = write_sweep(workspace, "at-50", spec)
    later.warm_starts = warm
    assert list(lifecycle.load_spec(later, check_file=False).start) == ["paper_lr", *warm]


@pytest.mark.parametrize(
    "settings, says",
    [
        pytest.param(["warm_start={from: [missing]}"], "no sweep named 'missing'", id="unknown-sweep"),
        pytest.param(
            ["objective={metric: val_loss, mode: min}"],
            "warm_start.from: sweep 'at-25' optimizes",
            id="another-objective",
        ),
        pytest.param(
            ["start={}", "search.model.d_model={type: categorical, choices: [32]}"],
            "warm_start.from: sweep 'at-25' has no complete trial whose searched values fit",
            id="nothing-fits",
        ),
        pytest.param(
            ["warm_start={from: [at-25], top: 5}"],
            "warm_start: 5 configurations and 1 starting points, but the sweep plans 5 trials",
            id="too-many",
        ),
    ],
)
def test_a_warm_start_is_refused_in_one_line_before_anything_is_created(workspace, capsys, settings, says):
    state = write_sweep(workspace, "at-25", quickstart())
    run_trials(start_sweep(workspace, state), state.backends.storage, [([1.0], 0.6 + 0.01 * n, True) for n in range(5)])
    code = main(
        [
            "sweep",
            "run",
            str(QUICKSTART),
            "--workspace",
            str(workspace.root),
            "--name",
            "later",
            *sets(*SETS, "warm_start={from: [at-25]}", *settings),
        ]
    )
    assert_refused(code, capsys.readouterr().err, says, created=(workspace.sweep_dir("later"),))
