"""The KubeRay manifests (cluster/kuberay/): valid Kubernetes objects, the RayCluster and RayJob
against the CRDs of the KubeRay the docs pin, every credential read from a Secret the documentation
has the reader create, each container holding only its own, MLflow's authentication as `seqae
cluster up` runs it, PostgreSQL's roles as cluster/postgres.py makes them, and the settings the
code reads. Nothing here needs a Kubernetes cluster: what was not run is said in the docs."""

from __future__ import annotations

import configparser
import copy
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from cluster import accounts, mlflow_server, postgres
from sweeps.stores import mlflow_access, ownership
from tests.conftest import REPO

KUBERAY = REPO / "cluster" / "kuberay"
DOCS = REPO / "docs" / "tutorial" / "cluster.md"
# KubeRay's RayCluster and RayJob schemas at the version the docs install, pruned (prune_crd)
CRDS = REPO / "tests" / "kuberay-crds.json"
# Kueue's ClusterQueue, LocalQueue, ResourceFlavor and WorkloadPriorityClass at v1beta2, from
# Kueue v0.19.2's config/components/crd/bases, pruned the same way
KUEUE_CRDS = REPO / "tests" / "kueue-crds.json"
KUSTOMIZATION = "kustomization.yaml"
QUEUE_LABEL, PRIORITY_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"
SECRETS = {"seqae-secrets", "seqae-postgres", "seqae-mlflow-accounts"}  # the docs' `kubectl create secret`s
# Kubernetes releases whose API schemas (bundled with kubernetes-validate) the manifests must meet.
KUBERNETES = ("1.30", "1.37")
CREDENTIAL = re.compile(r"PASSWORD|TOKEN|SECRET")  # environment variables whose value is a secret


def documents() -> list[tuple[str, dict[str, Any]]]:
    """``(file name, document)`` for every YAML document of every manifest (not the kustomization)."""
    return [
        (p.name, doc)
        for p in sorted(KUBERAY.glob("*.yaml"))
        if p.name != KUSTOMIZATION
        for doc in yaml.safe_load_all(p.read_text())
        if doc
    ]


def by_kind(kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for _, d in documents() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def pod_templates(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod templates inside an object, by where they sit."""
    spec = doc["spec"]
    if doc["kind"] == "RayCluster":
        return {
            "head": spec["headGroupSpec"]["template"],
            **{f"worker-{g['groupName']}": g["template"] for g in spec["workerGroupSpecs"]},
        }
    if doc["kind"] == "RayJob":
        return {"submitter": spec["submitterPodTemplate"]}
    if doc["kind"] == "StatefulSet":
        return {"postgres": spec["template"]}
    return {}


def prune_crd(node: Any, parent: str | None = None) -> Any:
    """A CRD's schema less its descriptions and its pod templates (which kubernetes-validate checks
    as core PodTemplates): how tests/kuberay-crds.json was made from KubeRay's Helm chart's CRDs."""
    if isinstance(node, dict):
        return {
            k: {"type": "object"}
            if parent == "properties" and k in ("template", "submitterPodTemplate", "rayClusterSpec")
            else prune_crd(v, k)
            for k, v in node.items()
            if k != "description" or isinstance(v, dict)
        }  # a field named description is kept
    if isinstance(node, list):
        return [prune_crd(v) for v in node]
    return node


def strict(schema: Any) -> Any:
    """``schema`` refusing unknown keys, as `kubectl apply` with server-side field validation does."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


def validate(doc: dict[str, Any], version: str) -> None:
    """Core objects against their schema; a KubeRay object's own keys against its pinned CRD, and
    its pod templates as core PodTemplates."""
    if doc["apiVersion"].startswith("kueue.x-k8s.io/"):
        assert doc["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        jsonschema.validate(doc, strict(json.loads(KUEUE_CRDS.read_text())[doc["kind"]]))
        return
    if not doc["apiVersion"].startswith("ray.io/"):
        kubernetes_validate.validate(doc, version, strict=True)  # strict: an unknown key fails
        return
    jsonschema.validate(doc, strict(json.loads(CRDS.read_text())[doc["kind"]]))
    for where, template in pod_templates(doc).items():
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{doc['metadata']['name']}-{where}"},
            "template": template,
        }
        kubernetes_validate.validate(pod_template, version, strict=True)


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every ``(key, value)`` of every mapping inside ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def containers(doc: dict[str, Any], where: str, init: bool = False) -> dict[str, dict[str, Any]]:
    spec = pod_templates(doc)[where]["spec"]
    return {c["name"]: c for c in spec["containers"] + (spec.get("initContainers", []) if init else [])}


def volumes_of(doc: dict[str, Any], where: str, container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The volumes ``container`` mounts, by mount path."""
    volumes = {v["name"]: v for v in pod_templates(doc)[where]["spec"].get("volumes", [])}
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}


@pytest.mark.parametrize("version", KUBERNETES)
def test_manifests_are_valid_kubernetes_objects(version):
    kinds = []
    for _, doc in documents():
        validate(doc, version)
        kinds.append(doc["kind"])
    assert sorted(kinds) == [
        "ConfigMap",
        "ConfigMap",
        "PersistentVolumeClaim",
        "RayCluster",
        "RayJob",
        "Service",
        "ServiceAccount",
        "StatefulSet",
    ]


def test_the_schemas_catch_a_mistake_inside_a_pod_template_and_in_kuberays_own_keys():
    """The checks have teeth: a misspelt key deep in the head's container fails them, and so does a
    KubeRay key that the pinned CRD does not have."""
    cluster = copy.deepcopy(by_kind("RayCluster"))
    server = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][1]
    ref = env_of(server)["MLFLOW_AUTH_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"]
    ref["kee"] = ref.pop("key")
    with pytest.raises(kubernetes_validate.ValidationError, match="kee"):
        validate(cluster, KUBERNETES[-1])
    for doc, path, key in [
        (by_kind("RayCluster"), ("spec", "authOptions"), "secretNam"),
        (by_kind("RayJob"), ("spec",), "shutdownAfterJobFinish"),
    ]:
        wrong = copy.deepcopy(doc)
        node = wrong
        for step in path:
            node = node[step]
        node[key] = "x"
        with pytest.raises(jsonschema.ValidationError, match=key):
            validate(wrong, KUBERNETES[-1])


def test_the_docs_install_the_kuberay_the_manifests_are_checked_against():
    pinned = json.loads(CRDS.read_text())["kuberay"]
    installs = re.findall(r"helm install \S+ kuberay/kuberay-operator --version (\S+)", DOCS.read_text())
    assert installs == [pinned], installs
    cluster = by_kind("RayCluster")["spec"]
    # authOptions: KubeRay 1.5.1 or later, and Ray 2.52 or later (KubeRay refuses older rayVersions)
    assert tuple(map(int, pinned.split("."))) >= (1, 5, 1) and cluster["authOptions"] == {"mode": "token"}
    assert tuple(map(int, cluster["rayVersion"].split("."))) >= (2, 52)


def test_every_credential_comes_from_a_secret_the_docs_create():
    docs = documents()
    assert "Secret" not in {d["kind"] for _, d in docs}  # the reader creates them; they never enter the repository
    env = [e for _, doc in docs for key, value in walk(doc) if key == "env" for e in value]
    credentials = [e for e in env if CREDENTIAL.search(e["name"])]
    assert {"MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY", "POSTGRES_PASSWORD"} <= {
        e["name"] for e in credentials
    }
    assert not [e for e in env if e["name"].startswith("RAY_AUTH")]  # KubeRay's authOptions sets the token
    for e in credentials:
        assert "value" not in e and e["valueFrom"]["secretKeyRef"]["name"] in SECRETS, e
    volumes = [v for _, doc in docs for key, value in walk(doc) if key == "volumes" for v in value]
    keys: dict[str, set[str]] = {}
    for e in credentials:
        keys.setdefault(e["valueFrom"]["secretKeyRef"]["name"], set()).add(e["valueFrom"]["secretKeyRef"]["key"])
    for v in volumes:
        if "secret" in v:
            assert v["secret"]["secretName"] in SECRETS, v
            keys.setdefault(v["secret"]["secretName"], set()).update(i["key"] for i in v["secret"].get("items", []))
    strings = [v for _, doc in docs for _, v in walk(doc) if isinstance(v, str)]
    assert not [s for s in strings if re.search(r"://[^/@\s]+:[^/@\s]+@", s)]  # no user:password@ in a URL
    assert not [s for s in strings if "admin_password" in s]  # the ConfigMap leaves the password to the Secret
    # The documentation's commands create exactly the keys the manifests read (the accounts'
    # Secret has a key per user, the documentation's first being the admin's).
    text = DOCS.read_text()
    for name in SECRETS:
        command = re.search(rf"kubectl create secret generic {name}(?:[^\n]*\\\n)*[^\n]*", text)
        assert command is not None, f"{DOCS.name} shows no `kubectl create secret generic {name}`"
        created = set(re.findall(r"--from-file=([\w-]+)", command.group(0)))
        assert created == (keys[name] or {mlflow_server.ADMIN}), (name, created)


def test_each_container_holds_its_own_credentials_and_no_others():
    """The drivers (the head's Ray container) read the studies' role's pgpass file and the users'
    MLflow passwords; the MLflow server MLflow's role's pgpass file and the admin's password; the
    workers and the job's submitter none (KubeRay gives them Ray's token)."""
    cluster = by_kind("RayCluster")
    every = containers(cluster, "head", init=True)
    (init,) = [c for c in every.values() if c["name"] not in ("ray-head", "mlflow")]
    copies = dict(re.findall(r"install -m 600 /var/run/seqae-secrets/(pgpass-\w+) (\S+)", " ".join(init["command"])))
    assert set(copies) == {f"pgpass-{purpose}" for purpose in postgres.ROLES}
    written = {mount["mountPath"]: mount["name"] for mount in init["volumeMounts"]}
    for name, purpose in [("ray-head", "optuna"), ("mlflow", "mlflow")]:
        container = every[name]
        env = env_of(container)
        pgpass = env["PGPASSFILE"]["value"]
        assert copies[f"pgpass-{purpose}"] == pgpass  # the file the init container wrote, mode 0600
        mounted = volumes_of(cluster, "head", container)
        (folder,) = [m for m in mounted if pgpass.startswith(m + "/")]
        assert mounted[folder]["emptyDir"] and written[folder] == mounted[folder]["name"]
        assert not [m for m in mounted if m.startswith("/var/run/seqae-secrets")]  # only the init container's
        other = next(p for p in postgres.ROLES if p != purpose)
        assert not [m for m, v in mounted.items() if v["name"] == f"pgpass-{other}"], (name, other)
        # every database URL it holds names its own role
        urls = [s for _, s in walk(container) if isinstance(s, str) and s.startswith("postgresql")]
        urls += [s for s in container.get("command", []) if s.startswith("postgresql")]
        assert urls and all(f"//{postgres.ROLES[purpose][0]}@" in u for u in urls), urls
    drivers = every["ray-head"]
    accounts_dir = env_of(drivers)[accounts.ACCOUNTS_ENV]["value"]
    assert accounts.ACCOUNTS_ENV == mlflow_access.ACCOUNTS_ENV
    assert volumes_of(cluster, "head", drivers)[accounts_dir]["secret"]["secretName"] == "seqae-mlflow-accounts"
    assert not [n for n in env_of(drivers) if n.startswith("MLFLOW_")]  # no password in the drivers' environment
    # The RayJob names whose sweep it is: a key of the accounts' Secret the docs create
    job = by_kind("RayJob")["spec"]
    owner = yaml.safe_load(job["runtimeEnvYAML"])["env_vars"][ownership.USER]
    assert accounts.NAME.fullmatch(owner)
    for where, doc in [(w, cluster) for w in pod_templates(cluster) if w != "head"] + [
        ("submitter", by_kind("RayJob"))
    ]:
        for container in containers(doc, where, init=True).values():
            env = env_of(container)
            assert not [n for n in env if n.startswith("MLFLOW_") or n in ("PGPASSFILE", accounts.ACCOUNTS_ENV)], where
            assert not volumes_of(doc, where, container), where


def test_mlflow_runs_with_authentication_as_seqae_cluster_up_runs_it():
    head = containers(by_kind("RayCluster"), "head")
    server = head["mlflow"]
    command = server["command"]
    flag = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
    # the command of `seqae cluster up`'s server (python -m mlflow ...), with this cluster's stores
    expected = mlflow_server.argv(
        flag["--backend-store-uri"], flag["--artifacts-destination"], int(flag["--port"]), auth=True
    )
    assert command == expected[2:]
    env = env_of(server)
    config_path = Path(env["MLFLOW_AUTH_CONFIG_PATH"]["value"])
    config_map = by_kind(
        "ConfigMap", volumes_of(by_kind("RayCluster"), "head", server)[str(config_path.parent)]["configMap"]["name"]
    )
    auth = configparser.ConfigParser()
    auth.read_string(config_map["data"][config_path.name])
    assert dict(auth["mlflow"]) == {
        "default_permission": "NO_PERMISSIONS",  # as `seqae cluster up`: new users get nothing until granted
        "database_uri": f"postgresql+psycopg://{postgres.ROLES['mlflow'][0]}@seqae-postgres:5432/mlflow_auth",
        "admin_username": mlflow_server.ADMIN,
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
    }


def test_postgres_is_made_as_cluster_postgres_makes_it():
    """services.yaml's init script creates the roles and databases of cluster/postgres.py, each
    database its purpose's role's and no other role's, no role a superuser; the Service is the host
    every URL names; the server is PostgreSQL 15."""
    script = by_kind("ConfigMap", "seqae-postgres-init")["data"]["seqae-init.sh"]
    roles = dict(
        re.findall(r"CREATE ROLE (\w+) (LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION) PASSWORD", script)
    )
    assert set(roles) == {role for role, _ in postgres.ROLES.values()}
    owners = dict(re.findall(r"CREATE DATABASE (\w+) OWNER (\w+);", script))
    assert owners == {db: postgres.ROLES[postgres.purpose_of(db)][0] for db in postgres.DATABASES}
    assert set(re.findall(r"REVOKE ALL ON DATABASE (\w+) FROM PUBLIC;", script)) == {*postgres.DATABASES, "postgres"}
    statefulset = by_kind("StatefulSet")
    (server,) = containers(statefulset, "postgres").values()
    assert server["image"] == "postgres:15"
    service = by_kind("Service", "seqae-postgres")
    assert service["spec"]["selector"] == statefulset["spec"]["template"]["metadata"]["labels"]
    hosts = {
        m.group(1)
        for _, doc in documents()
        if doc["kind"] in ("RayCluster", "ConfigMap")
        for _, s in walk(doc)
        if isinstance(s, str)
        for m in re.finditer(r"postgresql\+psycopg://\w+@([\w.-]+:\d+)/", s)
    }
    assert hosts == {f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"}


def test_the_pods_use_the_service_account_and_volume_that_services_yaml_makes():
    cluster = by_kind("RayCluster")
    account = by_kind("ServiceAccount")["metadata"]["name"]
    assert {t["spec"]["serviceAccountName"] for t in pod_templates(cluster).values()} == {account}
    claims = {v["claimName"] for key, v in walk(cluster) if key == "persistentVolumeClaim"}
    assert claims == {by_kind("PersistentVolumeClaim")["metadata"]["name"]}


def test_kuberay_manifests_set_what_the_code_reads():
    cluster = by_kind("RayCluster")
    head = env_of(containers(cluster, "head")["ray-head"])
    worker = env_of(containers(cluster, "worker-gpu")["ray-worker"])
    read_by_code = _env_names_read_by_code()
    for env in (head, worker):
        assert "SEQAE_STORAGE" in env
        assert {n for n in env if n.startswith("SEQAE_")} <= read_by_code
    head_env = {n: e.get("value") for n, e in head.items()}
    assert (
        head_env["SEQAE_OPTUNA_STORAGE"].startswith("postgresql+psycopg://") and "@" in head_env["SEQAE_OPTUNA_STORAGE"]
    )
    assert head_env["SEQAE_STORAGE"].startswith("s3://")
    # the RayJob's entrypoint is a valid seqae command on a sweep file that exists
    job = by_kind("RayJob")["spec"]
    assert set(yaml.safe_load(job["runtimeEnvYAML"])["env_vars"]) <= read_by_code
    argv = shlex.split(job["entrypoint"])
    assert argv[:3] == ["python", "-m", "seqae"]
    from seqae.cli.parser import build_parser

    args = build_parser().parse_args(argv[3:])
    assert args.or_resume and (REPO / args.file).exists()
    from sweeps.spec import sweep as spec_lib

    assert spec_lib.load(REPO / args.file, [f"profile={args.profile}"]).resources.gpu > 0  # trials on the GPU workers
    assert job["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]


def _env_names_read_by_code() -> set[str]:
    names = set()
    for path in list((REPO / "sweeps").rglob("*.py")) + list((REPO / "seqae_core").rglob("*.py")):
        names.update(re.findall(r"\"(SEQAE_[A-Z_]+)\"", path.read_text()))
    return names


def test_the_dockerfile_builds_the_image_the_manifests_name_at_the_versions_the_tests_run():
    """The Dockerfile's base is Ray's GPU image at the Ray this test runs (and raycluster.yaml's
    rayVersion) and this Python; it installs seqae's packages, Ray pinned to the same version, inside
    pyproject.toml's range, MLflow and Python inside theirs, torch's CUDA build; and its documented
    tag is the one every pod of the manifests runs."""
    import sys
    from importlib import metadata

    import ray
    import tomllib
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    dockerfile = (KUBERAY / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)$", dockerfile, re.M)
    image, tag = base.split(":")
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    assert image == "rayproject/ray" and tag == f"{ray.__version__}-{python}-gpu", base
    assert by_kind("RayCluster")["spec"]["rayVersion"] == ray.__version__
    assert f'"ray[tune,default]=={ray.__version__}"' in dockerfile
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ray_range = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "ray")
    assert ray_range.specifier.contains(ray.__version__)
    # the image's Python inside pyproject.toml's
    assert SpecifierSet(project["requires-python"]).contains(f"{sys.version_info.major}.{sys.version_info.minor}")
    # MLflow: the manifests' server reads MLFLOW_AUTH_ADMIN_PASSWORD, which 3.16.1 added; the image
    # installs pyproject.toml's range, and so do the tests
    mlflow_range = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "mlflow")
    assert "auth" in mlflow_range.extras and not mlflow_range.specifier.contains("3.16.0")
    assert mlflow_range.specifier.contains(metadata.version("mlflow"))
    # torch: PyPI's Linux wheel is its CUDA build, which the image's GPU base (the driver's libraries)
    # runs; a CPU index or a +cpu pin would make the workers' GPUs idle
    assert "download.pytorch.org/whl/cpu" not in dockerfile and "+cpu" not in dockerfile
    assert tag.endswith("-gpu")
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY --chown=ray:users (\w+) ", dockerfile, re.M))
    assert copied == {p.rstrip(".*") for p in packages}, "the image installs every package pyproject.toml names"
    (built,) = re.findall(r"docker build -f cluster/kuberay/Dockerfile -t (\S+) \.", dockerfile)
    assert built.endswith(f":{project['version']}")
    images = {
        c["image"]
        for _, doc in documents()
        if doc["apiVersion"].startswith("ray.io/")
        for template in pod_templates(doc).values()
        for c in template["spec"]["containers"] + template["spec"].get("initContainers", [])
    }
    assert images == {built}


@pytest.mark.slow
def test_the_postgres_init_script_makes_the_roles_on_a_real_postgresql(tmp_path):
    """services.yaml's init script, run as the postgres image runs it (bash, as the superuser, the
    passwords in its environment) against a fresh PostgreSQL: each role reaches its own databases
    with its password, no other, and is no superuser."""
    import os
    import secrets
    import subprocess

    import psycopg

    from cluster.procs import free_port

    pg = postgres.create(tmp_path / "secrets", free_port())
    socket_dir = Path(pg.data_dir).parent
    postgres._run(
        [
            str(postgres.bindir() / "pg_ctl"),
            "-D",
            pg.data_dir,
            "-l",
            str(socket_dir / "postgres.log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {pg.port} -k {socket_dir}",
            "start",
        ],
        pg.run_as,
    )
    try:
        passwords = {purpose: secrets.token_urlsafe(24) for purpose in postgres.ROLES}
        script = by_kind("ConfigMap", "seqae-postgres-init")["data"]["seqae-init.sh"]
        env = {
            **os.environ,
            "PATH": f"{postgres.bindir()}:{os.environ['PATH']}",
            "POSTGRES_USER": postgres.ROLE,
            "PGHOST": "127.0.0.1",
            "PGPORT": str(pg.port),
            "PGPASSFILE": pg.pgpass,
            "SEQAE_OPTUNA_PASSWORD": passwords["optuna"],
            "SEQAE_MLFLOW_PASSWORD": passwords["mlflow"],
        }
        ran = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr

        def connect(purpose: str, database: str) -> psycopg.Connection:
            return psycopg.connect(
                host="127.0.0.1",
                port=pg.port,
                user=postgres.ROLES[purpose][0],
                dbname=database,
                password=passwords[purpose],
                connect_timeout=5,
                autocommit=True,
            )

        for purpose, (_, databases) in postgres.ROLES.items():
            for database in postgres.DATABASES + ("postgres",):
                if database in databases:
                    with connect(purpose, database) as db:
                        assert db.execute(
                            "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user"
                        ).fetchone() == (False, False, False)
                        db.execute("CREATE TABLE mine (x int)")  # its database's public schema is its own
                else:
                    with pytest.raises(psycopg.OperationalError, match="permission denied|not have CONNECT"):
                        connect(purpose, database)
    finally:
        postgres.stop(pg)


# -- under Kueue: cluster/kuberay/kueue/ ------------------------------------------------------
def kueue_overlay() -> list[dict[str, Any]]:
    """What `kubectl apply -k cluster/kuberay/kueue` applies: the base kustomization's files and
    queues.yaml, with the overlay's JSON patches applied (the kustomize features the overlay uses,
    and no others: a new one fails here until this renders it)."""
    import jsonpatch

    def render(folder: Path) -> list[dict[str, Any]]:
        kustomization = yaml.safe_load((folder / KUSTOMIZATION).read_text())
        assert set(kustomization) <= {"apiVersion", "kind", "resources", "patches"}
        docs = []
        for resource in kustomization["resources"]:
            path = (folder / resource).resolve()
            docs += render(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
        for patch in kustomization.get("patches", []):
            target = patch["target"]
            hits = [
                i
                for i, d in enumerate(docs)
                if d["kind"] == target["kind"]
                and d["metadata"]["name"] == target["name"]
                and d["apiVersion"] == f"{target['group']}/{target['version']}"
            ]
            assert len(hits) == 1, target
            docs[hits[0]] = jsonpatch.apply_patch(docs[hits[0]], yaml.safe_load(patch["patch"]))
        return docs

    return render(KUBERAY / "kueue")


def quantity(value: str | int) -> float:
    """A Kubernetes quantity (``16``, ``500m``, ``64Gi``) as a number."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    text = str(value)
    unit = next((u for u in units if text.endswith(u)), None)
    return float(text.removesuffix(unit)) * units[unit] if unit else float(text)


@pytest.mark.parametrize("version", KUBERNETES)
def test_the_kueue_overlay_renders_to_valid_objects(version):
    docs = kueue_overlay()
    for doc in docs:
        validate(doc, version)
    assert sorted(d["kind"] for d in docs) == sorted(
        [d["kind"] for n, d in documents() if n != "rayjob.yaml"]
        + ["ClusterQueue", "LocalQueue", "ResourceFlavor", "WorkloadPriorityClass", "WorkloadPriorityClass"]
    )
    typo = copy.deepcopy(next(d for d in docs if d["kind"] == "ClusterQueue"))
    typo["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuta"] = 1  # the check has teeth
    with pytest.raises(jsonschema.ValidationError, match="nominalQuta"):
        validate(typo, version)


def test_under_kueue_the_cluster_is_one_workload_kueue_admits_and_does_not_evict_for_a_sweep():
    """Kueue's rules for a RayCluster (its webhook, v0.19.2: no in-tree autoscaling, at most 7
    worker groups, none named head), its labels naming objects that exist, a priority above a
    sweep-as-a-job's, and a quota that covers the whole cluster (else Kueue never admits it)."""
    docs = kueue_overlay()
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    labels = cluster["metadata"]["labels"]
    local = named["LocalQueue", labels[QUEUE_LABEL]]
    queue = named["ClusterQueue", local["spec"]["clusterQueue"]]
    priorities = {d["metadata"]["name"]: d["value"] for d in docs if d["kind"] == "WorkloadPriorityClass"}
    assert priorities[labels[PRIORITY_LABEL]] == max(priorities.values()) > min(priorities.values())
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is False
    groups = spec["workerGroupSpecs"]
    assert len(groups) <= 7 and "head" not in {g["groupName"] for g in groups}
    assert all(g["replicas"] == g["minReplicas"] == g["maxReplicas"] > 0 for g in groups)
    wanted: dict[str, float] = {}
    for where, template in pod_templates(cluster).items():
        count = 1 if where == "head" else next(g["replicas"] for g in groups if f"worker-{g['groupName']}" == where)
        for container in template["spec"]["containers"]:
            resources = container.get("resources", {})
            for name, value in {**resources.get("limits", {}), **resources.get("requests", {})}.items():
                wanted[name] = wanted.get(name, 0.0) + count * quantity(value)
    (group,) = queue["spec"]["resourceGroups"]
    assert set(wanted) <= set(group["coveredResources"])
    quota = {r["name"]: quantity(r["nominalQuota"]) for f in group["flavors"] for r in f["resources"]}
    assert all(quota[name] >= amount for name, amount in wanted.items()), (quota, wanted)
    # without Kueue, the base cluster still autoscales, and carries no Kueue label
    base = by_kind("RayCluster")
    assert base["spec"]["enableInTreeAutoscaling"] is True and "labels" not in base["metadata"]


def test_a_sweeps_rayjob_runs_on_the_cluster_and_carries_no_queue_label():
    """Kueue manages no RayJob that selects an existing cluster (v0.19.2; older versions refuse a
    labelled one): the sweep's share of the cluster is seqae's queue's business."""
    job = by_kind("RayJob")
    assert job["spec"]["clusterSelector"] and "rayClusterSpec" not in job["spec"]
    assert not {QUEUE_LABEL, PRIORITY_LABEL} & set(job["metadata"].get("labels", {}))
