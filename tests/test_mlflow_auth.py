"""MLflow's own authentication on the server `seqae cluster up` starts, which a team shares: the
PostgreSQL and MLflow server of `seqae cluster services` (no Ray; the Ray side, with a sweep that
tracks through it, is in test_cluster.py)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cluster.procs import free_port
from tests.sweep_helpers import SMOKE, STUDIES, forwarded, kill_group, seqae, sets, start, wait_for
from tests.test_troubleshooting import assert_quoted

pytestmark = pytest.mark.slow

NOBODY = {"MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""}  # MLflow's client sends no credentials


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    from cluster import local

    root = tmp_path_factory.mktemp("services")
    up = seqae("cluster", "services", "--dir", str(root), timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    state = local.read_state(root)
    try:
        yield {
            "root": root,
            "state": state,
            "env": local.environment(state),
            "output": up.stdout + up.stderr,
            "admin": local.mlflow_credentials(state),
        }
    finally:
        down = seqae("cluster", "down", "--dir", str(root), timeout=120)
        assert down.returncode == 0, down.stderr


def api(
    services,
    path: str,
    body: dict | None = None,
    user: tuple[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> dict:
    """One call of MLflow's REST API, as ``user`` (name, password) or without credentials."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(user).encode()).decode()
    request = urllib.request.Request(
        f"{services['env']['SEQAE_MLFLOW_TRACKING_URI']}/api/2.0/mlflow/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers=headers,
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def refused(call) -> urllib.error.HTTPError:
    with pytest.raises(urllib.error.HTTPError) as error:
        call()
    return error.value


def admin(services) -> tuple[str, str]:
    return services["admin"]["MLFLOW_TRACKING_USERNAME"], services["admin"]["MLFLOW_TRACKING_PASSWORD"]


def experiment_names(services, user: tuple[str, str] | None = None) -> set[str]:
    """The experiments ``user`` (the admin by default) may see."""
    found = api(services, "experiments/search?max_results=1000", user=user or admin(services))
    return {e["name"] for e in found.get("experiments", [])}


def test_requests_without_valid_credentials_get_401_and_create_nothing(services, monkeypatch):
    create = {"name": "intruder"}
    for user in (None, ("admin", "not-the-password"), ("mallory", "any-password-12")):
        answer = refused(lambda user=user: api(services, "experiments/create", create, user=user))
        assert answer.code == 401, user
        assert answer.headers["WWW-Authenticate"].startswith("Basic")  # what makes a browser ask
    assert "intruder" not in experiment_names(services)
    # the admin's credentials pass, and the Host check still holds with them
    api(services, "experiments/create", {"name": "admins"}, user=admin(services))
    assert "admins" in experiment_names(services)
    foreign = refused(
        lambda: api(
            services, "experiments/search?max_results=1", user=admin(services), headers={"Host": "evil.example:80"}
        )
    )
    assert foreign.code == 403

    # the driver's writer does not take a refusal for an outage to wait out
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from sweeps.stores.mlflow_access import unreachable

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-password")
    with pytest.raises(MlflowException) as error:
        MlflowClient(services["env"]["SEQAE_MLFLOW_TRACKING_URI"]).create_experiment("intruder")
    assert error.value.get_http_status_code() == 401 and not unreachable(error.value)
    assert "intruder" not in experiment_names(services)


@pytest.mark.parametrize(
    "credentials, who",
    [
        pytest.param(
            {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "not-the-password"},
            "user 'admin' (MLFLOW_TRACKING_USERNAME)",
            id="wrong",
        ),
        pytest.param(NOBODY, "requests without credentials", id="none"),
    ],
)
def test_a_sweep_without_valid_credentials_stops_at_once_and_creates_nothing(services, tmp_path, credentials, who):
    """Exit code 2 and what to set, before the data is prepared or anything is created."""
    from sweeps.stores.search import study_exists

    workspace = tmp_path / "ws"
    run = seqae(
        "sweep",
        "run",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        "locked",
        "--workspace",
        str(workspace),
        *sets(*SMOKE),
        env={**services["env"], **credentials},
        timeout=120,
    )
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"refuses {who} with 401" in run.stderr and "MLFLOW_TRACKING_PASSWORD" in run.stderr, run.stderr
    assert not (workspace / "sweeps").exists()
    assert "locked" not in experiment_names(services)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PGPASSFILE", services["env"]["PGPASSFILE"])
        assert not study_exists(services["env"]["SEQAE_OPTUNA_STORAGE"], "locked")


def test_env_sh_gives_the_shell_the_credentials_and_no_secret_is_written_out(services):
    root, state = services["root"], services["state"]
    password = services["admin"]["MLFLOW_TRACKING_PASSWORD"]
    env_sh = (root / "env.sh").read_text()
    sourced = subprocess.run(["bash", "-c", f"source {root / 'env.sh'} && env -0"], capture_output=True, text=True)
    exported = dict(line.split("=", 1) for line in sourced.stdout.split("\0") if "=" in line)
    assert {k: exported[k] for k in {**services["env"], **services["admin"]}} == {
        **services["env"],
        **services["admin"],
    }
    assert "MLFLOW_TRACKING_PASSWORD" in env_sh and password not in env_sh  # read from its file when sourced

    secrets_dir = root / "secrets"
    assert oct(secrets_dir.stat().st_mode)[-3:] == "700"
    assert {p.name: oct(p.stat().st_mode)[-3:] for p in secrets_dir.iterdir()} == {
        "pgpass": "600",
        "pgpass-optuna": "600",
        "pgpass-mlflow": "600",
        "mlflow_password": "600",
        "mlflow_auth.ini": "600",
        "mlflow_accounts": "700",
    }
    assert Path(state.mlflow.password_file).parent == secrets_dir
    status = seqae("cluster", "status", "--dir", str(root))
    assert status.returncode == 0 and json.loads(status.stdout)["services"] == {"mlflow": True, "postgres": True}
    for text in (
        status.stdout,
        services["output"],
        *(p.read_text(errors="replace") for p in (root / "logs").iterdir()),
    ):
        assert password not in text
    assert "admin" in services["output"] and state.mlflow.password_file in services["output"]


def test_seqae_ui_opens_the_servers_own_ui_where_the_browser_asks_for_the_user(services, tmp_path):
    uri = services["env"]["SEQAE_MLFLOW_TRACKING_URI"]
    optuna_port = free_port()
    ui_args = ("ui", "--workspace", str(tmp_path / "ws"), "--optuna-port", str(optuna_port))
    wrong = seqae(*ui_args, env={**services["env"], **NOBODY}, timeout=60)
    assert wrong.returncode == 2 and "MLFLOW_TRACKING_USERNAME" in wrong.stderr, wrong.stderr

    log = tmp_path / "ui.log"
    ui = start(*ui_args, log=log, env={**services["env"], **services["admin"]})
    try:
        wait_for(lambda: "Ctrl-C stops optuna-dashboard" in log.read_text(), 120, "seqae ui")
        assert f"MLflow UI         {uri}  " in log.read_text()  # the server's own UI; no second server
        page = refused(lambda: urllib.request.urlopen(f"{uri}/", timeout=10))
        assert page.code == 401 and page.headers["WWW-Authenticate"].startswith("Basic")
        request = urllib.request.Request(
            f"{uri}/",
            headers={"Authorization": "Basic " + base64.b64encode(":".join(admin(services)).encode()).decode()},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200 and b"<html" in response.read().lower()
        with urllib.request.urlopen(f"http://127.0.0.1:{optuna_port}/api/studies", timeout=10) as response:
            assert response.status == 200
    finally:
        ui.send_signal(signal.SIGINT)
        try:
            assert ui.wait(timeout=60) == 0
        finally:
            kill_group(ui)
    assert "stopped optuna-dashboard" in log.read_text()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", optuna_port), timeout=2).close()
    with urllib.request.urlopen(f"{uri}/health", timeout=10) as response:
        assert response.status == 200  # the cluster's server keeps running


def test_a_restart_keeps_the_admin_password_and_the_users(services, monkeypatch):
    """`down` then `up` on the same folder: the same admin password, and the users made meanwhile."""
    from mlflow.server import get_app_client

    uri, root = services["env"]["SEQAE_MLFLOW_TRACKING_URI"], services["root"]
    for key, value in services["admin"].items():
        monkeypatch.setenv(key, value)
    bob = ("bob", "bobs-password-1234")
    users = get_app_client("basic-auth", tracking_uri=uri)
    users.create_user(*bob)
    kept = api(services, "experiments/create", {"name": "kept"}, user=admin(services))["experiment_id"]
    assert experiment_names(services, bob) == set()  # a new user starts with no permission
    assert "default_permission = NO_PERMISSIONS" in (root / "secrets" / "mlflow_auth.ini").read_text()
    users.grant_user_permission("bob", "experiment", kept, "READ")
    assert experiment_names(services, bob) == {"kept"}

    down = seqae("cluster", "down", "--dir", str(root), timeout=120)
    assert down.returncode == 0 and "MLflow server" in down.stdout, down.stdout + down.stderr
    up = seqae("cluster", "services", "--dir", str(root), timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr

    from cluster import local

    assert local.mlflow_credentials(local.read_state(root)) == services["admin"]
    assert "kept" in experiment_names(services)  # the admin's password still opens the same runs
    assert experiment_names(services, bob) == {"kept"}  # bob, his password and his grant are kept
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] not in up.stdout + up.stderr


def connect(services, role: str, database: str, passfile: str):
    import psycopg

    port = services["state"].postgres.port
    return psycopg.connect(
        host="127.0.0.1", port=port, user=role, dbname=database, passfile=passfile, connect_timeout=5, autocommit=True
    )


def test_a_users_database_role_reaches_the_studies_only_and_is_no_superuser(services, tmp_path):
    """env.sh's PGPASSFILE holds the studies' role alone: it reads and writes Optuna's database, and
    cannot reach MLflow's runs or its users, make roles, or run programs as the server."""
    import psycopg

    from sweeps.stores.search import study_exists

    users_file = services["env"]["PGPASSFILE"]
    assert Path(users_file).name == "pgpass-optuna"
    assert "seqae_optuna" in services["env"]["SEQAE_OPTUNA_STORAGE"]
    with connect(services, "seqae_optuna", "optuna", users_file) as db:
        flags = db.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user")
        assert flags.fetchone() == (False, False, False)
        marker = tmp_path / "ran"
        for sql in (
            f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'",
            "CREATE ROLE mallory LOGIN SUPERUSER",
            "ALTER ROLE seqae_optuna SUPERUSER",
            "CREATE DATABASE mine",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(sql)
        assert not marker.exists()
    for database in ("mlflow", "mlflow_auth", "postgres"):  # its password opens no other database
        with pytest.raises(psycopg.OperationalError, match="permission denied|not have CONNECT"):
            connect(services, "seqae_optuna", database, users_file)
    for role in ("seqae", "seqae_mlflow"):  # and the file holds no other role's password
        with pytest.raises(psycopg.OperationalError, match="password"):
            connect(services, role, "mlflow_auth", users_file)
    # the MLflow server's role is the only one of the two that reaches MLflow's users
    state = services["state"]
    mlflow_file = state.postgres.pgpass_of("mlflow")
    with connect(services, "seqae_mlflow", "mlflow_auth", mlflow_file) as db:
        assert db.execute("SELECT count(*) FROM users WHERE username = 'admin'").fetchone() == (1,)
    with pytest.MonkeyPatch.context() as mp:  # and the studies' role still serves Optuna
        mp.setenv("PGPASSFILE", users_file)
        import optuna

        optuna.create_study(study_name="roles", storage=services["env"]["SEQAE_OPTUNA_STORAGE"]).optimize(
            lambda trial: trial.suggest_float("x", 0, 1), n_trials=1
        )
        assert study_exists(services["env"]["SEQAE_OPTUNA_STORAGE"], "roles")


def test_a_cluster_made_before_the_roles_hands_its_tables_to_them_on_its_next_start(services):
    """Objects the superuser made (as every cluster did before the roles) become the role's when
    the roles are ensured, which every start does: the studies' role then writes to them."""
    import optuna

    from cluster import postgres

    pg = services["state"].postgres
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PGPASSFILE", pg.pgpass)
        # a fresh table and enum type of the superuser's own, as an old cluster's Optuna schema was
        with connect(services, postgres.ROLE, "optuna", pg.pgpass) as db:
            db.execute("CREATE TYPE old_state AS ENUM ('a', 'b')")
            db.execute("CREATE TABLE old_rows (id serial PRIMARY KEY, state old_state)")
    with connect(services, "seqae_optuna", "optuna", pg.pgpass_of("optuna")) as db:
        with pytest.raises(Exception, match="permission denied"):
            db.execute("INSERT INTO old_rows (state) VALUES ('a')")
    postgres.ensure_roles(pg)
    with connect(services, "seqae_optuna", "optuna", pg.pgpass_of("optuna")) as db:
        db.execute("INSERT INTO old_rows (state) VALUES ('b')")
        assert db.execute("SELECT count(*) FROM old_rows").fetchone() == (1,)
        db.execute("DROP TABLE old_rows")
        db.execute("DROP TYPE old_state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PGPASSFILE", pg.pgpass_of("optuna"))
        optuna.create_study(study_name="after-hand-over", storage=pg.url("optuna")).optimize(
            lambda trial: trial.suggest_float("x", 0, 1), n_trials=1
        )


def permission_of(services, experiment_id: str, user: str) -> str:
    """``user``'s permission on the experiment, as MLflow's admin reads it."""
    from mlflow.server import get_app_client

    with pytest.MonkeyPatch.context() as mp:
        for key, value in services["admin"].items():
            mp.setenv(key, value)
        client = get_app_client("basic-auth", tracking_uri=services["env"]["SEQAE_MLFLOW_TRACKING_URI"])
        return client.get_user_permission(user, "experiment", experiment_id).permission


def test_each_user_gets_an_mlflow_account_and_a_driver_on_the_head_writes_as_the_submitter(services, tmp_path):
    """`seqae cluster add-user`: the user's own login, in a folder that works wherever it is copied;
    what they create is theirs (MLflow gives its creator MANAGE, others nothing); a driver that runs
    where the head's accounts folder is named signs in as the user its job names, and one whose user
    has no account stops at once."""
    import shutil

    from cluster import accounts, local
    from sweeps.stores import mlflow_access, ownership

    assert accounts.ACCOUNTS_ENV == mlflow_access.ACCOUNTS_ENV
    root, uri = services["root"], services["env"]["SEQAE_MLFLOW_TRACKING_URI"]
    # the token of the Ray that a head started by hand keeps (services starts none)
    token = tmp_path / "ray-auth-token"
    token.write_text("the-heads-ray-token")
    ray = {"RAY_AUTH_TOKEN_PATH": str(token)}
    added = seqae("cluster", "add-user", "alice", "--dir", str(root), env=ray)
    assert added.returncode == 0, added.stdout + added.stderr
    folder = root / "users" / "alice"
    password = (folder / "mlflow_password").read_text()
    assert password not in added.stdout + added.stderr and str(folder) in added.stdout
    assert {p.name: oct(p.stat().st_mode)[-3:] for p in folder.iterdir()} == {
        "env.sh": "600",
        "mlflow_password": "600",
        "ray_token": "600",
        "pgpass": "600",
    }
    assert (folder / "ray_token").read_text() == "the-heads-ray-token"  # the head's Ray's own
    assert (root / "secrets" / "mlflow_accounts" / "alice").read_text() == password
    for again, why in (
        ("alice", "already has an MLflow account"),
        ("Alice!", "use lower-case letters"),
        ("admin", "MLflow's admin"),
    ):
        refused_user = seqae("cluster", "add-user", again, "--dir", str(root), env=ray)
        assert refused_user.returncode == 2 and why in refused_user.stderr, refused_user.stderr

    laptop = tmp_path / "laptop"  # the folder copied elsewhere still finds its files
    shutil.copytree(folder, laptop)
    sourced = subprocess.run(
        ["bash", "-c", f"source {laptop / 'env.sh'} && env -0"], capture_output=True, text=True, cwd="/"
    )
    exported = dict(line.split("=", 1) for line in sourced.stdout.split("\0") if "=" in line)
    assert exported["MLFLOW_TRACKING_USERNAME"] == "alice" and exported["MLFLOW_TRACKING_PASSWORD"] == password
    assert exported["PGPASSFILE"] == str(laptop / "pgpass") and exported["SEQAE_MLFLOW_TRACKING_URI"] == uri
    alice = ("alice", password)
    mine = api(services, "experiments/create", {"name": "alices"}, user=alice)["experiment_id"]
    assert seqae("cluster", "add-user", "dave", "--dir", str(root), env=ray).returncode == 0
    dave = ("dave", (root / "users" / "dave" / "mlflow_password").read_text())
    assert experiment_names(services, dave) == set() and "alices" in experiment_names(services)
    assert permission_of(services, mine, "alice") == "MANAGE"

    head = {**services["env"], **NOBODY, mlflow_access.ACCOUNTS_ENV: str(accounts.accounts_dir(local.read_state(root)))}
    run = seqae(
        "sweep",
        "run",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        "alices-sweep",
        "--workspace",
        str(tmp_path / "ws"),
        *sets(*SMOKE, "trials.total=1"),
        env={**head, ownership.USER: "alice"},
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    sweep = next(
        e
        for e in api(services, "experiments/search?max_results=1000", user=alice)["experiments"]
        if e["name"] == "alices-sweep"
    )
    assert permission_of(services, sweep["experiment_id"], "alice") == "MANAGE"  # alice created it: the driver was
    assert "alices-sweep" not in experiment_names(services, dave)
    nobody = seqae(
        "sweep",
        "run",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        "carols",
        "--workspace",
        str(tmp_path / "ws2"),
        *sets(*SMOKE),
        env={**head, ownership.USER: "carol"},
        timeout=120,
    )
    assert nobody.returncode == 2 and "no MLflow account for 'carol'" in nobody.stderr, nobody.stderr
    assert "carols" not in experiment_names(services)


def test_mlflow_answers_through_a_tunnel_on_any_local_port_and_still_refuses_a_foreign_host(services, monkeypatch):
    """A browser or client behind a forward on another local port sends the Host
    ``127.0.0.1:<that port>`` or ``localhost:<that port>``: the server takes any loopback Host,
    and still refuses a foreign one (DNS rebinding) and a write from a foreign page's origin."""
    from mlflow.tracking import MlflowClient

    server_port = int(services["env"]["SEQAE_MLFLOW_TRACKING_URI"].rsplit(":", 1)[1])
    with forwarded(server_port) as port:
        assert port != server_port
        for key, value in services["admin"].items():
            monkeypatch.setenv(key, value)
        client = MlflowClient(f"http://127.0.0.1:{port}")  # sends Host: 127.0.0.1:<port>
        tunnelled = client.create_experiment("through-a-tunnel")
        assert client.get_experiment(tunnelled).name == "through-a-tunnel"

        def through(path: str, host: str, origin: str | None = None, body: dict | None = None) -> int:
            headers = {
                "Host": host,
                "Authorization": "Basic " + base64.b64encode(":".join(admin(services)).encode()).decode(),
                **({"Origin": origin} if origin else {}),
                **({"Content-Type": "application/json"} if body else {}),
            }
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}{path}",
                headers=headers,
                method="POST" if body else "GET",
                data=json.dumps(body).encode() if body else None,
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as error:
                return error.code

        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):  # a browser leaves out port 80
            assert through("/", host) == 200, host  # the UI's page
        create = "/api/2.0/mlflow/experiments/create"
        assert through(create, f"localhost:{port}", f"http://localhost:{port}", {"name": "from-the-ui"}) == 200
        assert through("/", f"evil.example:{port}") == 403  # DNS rebinding: a foreign name for this address
        assert through("/", f"127.0.0.1.evil.example:{port}") == 403
        assert through(create, f"localhost:{port}", "http://evil.example", {"name": "from-a-foreign-page"}) == 403
    assert "from-a-foreign-page" not in experiment_names(services)


def test_a_sweep_reaching_mlflow_by_a_name_it_does_not_allow_is_told_to_use_loopback(services):
    """A forward that listens on another address (here 127.0.0.2, as a laptop's LAN address or a
    shared tunnel host): the server's Host check refuses it, and the driver says so, not that the
    credentials are wrong, before anything is created."""
    server_port = int(services["env"]["SEQAE_MLFLOW_TRACKING_URI"].rsplit(":", 1)[1])
    with forwarded(server_port, listen="127.0.0.2") as port:
        uri = f"http://127.0.0.2:{port}"
        run = seqae(
            "sweep",
            "run",
            str(STUDIES / "quickstart.yaml"),
            "--name",
            "by-name",
            "--workspace",
            str(services["root"] / "by-name"),
            *sets(*SMOKE),
            env={**services["env"], **services["admin"], "SEQAE_MLFLOW_TRACKING_URI": uri},
            timeout=120,
        )
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    line = next(line for line in run.stderr.splitlines() if line.startswith("seqae: error: "))
    assert f"refuses the Host '127.0.0.2:{port}' with 403" in line and "127.0.0.1" in line, line
    assert_quoted(line)
    assert "by-name" not in experiment_names(services)
