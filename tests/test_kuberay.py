"""The KubeRay manifests (cluster/kuberay/): valid Kubernetes objects, every credential read from
the Secret the documentation has the reader create, MLflow's authentication as `seqae cluster up`
runs it, and the settings the code reads."""

from __future__ import annotations

import configparser
import copy
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from cluster import mlflow_server
from tests.conftest import REPO

KUBERAY = REPO / "cluster" / "kuberay"
DOCS = REPO / "docs" / "tutorial" / "cluster.md"
SECRET = "seqae-secrets"  # the Secret the documentation's `kubectl create secret` makes
# Kubernetes releases whose API schemas (bundled with kubernetes-validate) the manifests must meet.
KUBERNETES = ("1.30", "1.37")
CREDENTIAL = re.compile(r"PASSWORD|TOKEN|SECRET")  # environment variables whose value is a secret


def documents() -> list[tuple[str, dict[str, Any]]]:
    """``(file name, document)`` for every YAML document of every manifest."""
    return [(p.name, doc) for p in sorted(KUBERAY.glob("*.yaml"))
            for doc in yaml.safe_load_all(p.read_text()) if doc]


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for _, d in documents() if d["kind"] == kind]
    return doc


def pod_templates(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod templates inside a KubeRay object, by where they sit."""
    spec = doc["spec"]
    if doc["kind"] == "RayCluster":
        return {"head": spec["headGroupSpec"]["template"],
                **{f"worker-{g['groupName']}": g["template"] for g in spec["workerGroupSpecs"]}}
    if doc["kind"] == "RayJob":
        return {"submitter": spec["submitterPodTemplate"]}
    raise AssertionError(f"{doc['kind']}: no pod templates known; add them here")


def validate(doc: dict[str, Any], version: str) -> None:
    """Core objects against their schema; a KubeRay object's pod templates as core PodTemplates.
    No package on the registries ships KubeRay's CRD schemas, so a RayCluster's or RayJob's own
    keys (rayVersion, workerGroupSpecs, entrypoint, ...) are checked by no schema here."""
    if not doc["apiVersion"].startswith("ray.io/"):
        kubernetes_validate.validate(doc, version, strict=True)  # strict: an unknown key fails
        return
    for where, template in pod_templates(doc).items():
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": f"{doc['metadata']['name']}-{where}"}, "template": template}
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
    return {e["name"]: e for e in container["env"]}


def containers(doc: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_templates(doc)[where]["spec"]["containers"]}


@pytest.mark.parametrize("version", KUBERNETES)
def test_manifests_are_valid_kubernetes_objects(version):
    kinds = []
    for _, doc in documents():
        validate(doc, version)
        kinds.append(doc["kind"])
    assert sorted(kinds) == ["ConfigMap", "RayCluster", "RayJob"]


def test_the_schemas_catch_a_mistake_inside_a_pod_template():
    """The check has teeth: a misspelt key deep in the head's container fails it."""
    cluster = copy.deepcopy(by_kind("RayCluster"))
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"][1]["valueFrom"]["secretKeyRef"]["kee"] = head["env"][1]["valueFrom"]["secretKeyRef"].pop("key")
    with pytest.raises(kubernetes_validate.ValidationError, match="kee"):
        validate(cluster, KUBERNETES[-1])


def test_every_credential_comes_from_the_secret():
    docs = documents()
    assert "Secret" not in {d["kind"] for _, d in docs}  # the reader creates it; it never enters the repository
    env = [e for _, doc in docs for key, value in walk(doc) if key == "env" for e in value]
    credentials = [e for e in env if CREDENTIAL.search(e["name"])]
    assert {"RAY_AUTH_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD",
            "MLFLOW_FLASK_SERVER_SECRET_KEY"} <= {e["name"] for e in credentials}
    for e in credentials:
        assert "value" not in e and e["valueFrom"]["secretKeyRef"]["name"] == SECRET, e
    volumes = [v for _, doc in docs for key, value in walk(doc) if key == "volumes" for v in value]
    assert all(v["secret"]["secretName"] == SECRET for v in volumes if "secret" in v)
    keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in credentials} | {
        item["key"] for v in volumes if "secret" in v for item in v["secret"]["items"]}
    assert keys == {"ray-token", "pgpass", "mlflow-password", "mlflow-flask-secret-key"}
    strings = [v for _, doc in docs for _, v in walk(doc) if isinstance(v, str)]
    assert not [s for s in strings if re.search(r"://[^/@\s]+:[^/@\s]+@", s)]  # no user:password@ in a URL
    assert not [s for s in strings if "admin_password" in s]  # the ConfigMap leaves the password to the Secret
    # The documentation's command creates exactly the keys the manifests read.
    command = re.search(rf"kubectl create secret generic {SECRET}(?:[^\n]*\\\n)*[^\n]*", DOCS.read_text())
    assert command is not None, f"{DOCS.name} shows no `kubectl create secret generic {SECRET}`"
    assert set(re.findall(r"--from-file=([\w-]+)", command.group(0))) == keys


def test_mlflow_runs_with_authentication_as_seqae_cluster_up_runs_it():
    head = containers(by_kind("RayCluster"), "head")
    server = head["mlflow"]
    command = server["command"]
    flag = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
    # the command of `seqae cluster up`'s server (python -m mlflow ...), with this cluster's stores
    expected = mlflow_server.argv(flag["--backend-store-uri"], flag["--artifacts-destination"],
                                  int(flag["--port"]), auth=True)
    assert command == expected[2:]
    env = env_of(server)
    config_path = Path(env["MLFLOW_AUTH_CONFIG_PATH"]["value"])
    (mount,) = [m for m in server["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    (volume,) = [v for v in pod_templates(by_kind("RayCluster"))["head"]["spec"]["volumes"]
                 if v["name"] == mount["name"]]
    config_map = by_kind("ConfigMap")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    auth = configparser.ConfigParser()
    auth.read_string(config_map["data"][config_path.name])
    assert dict(auth["mlflow"]) == {
        "default_permission": "NO_PERMISSIONS",  # as `seqae cluster up`: new users get nothing until granted
        "database_uri": "postgresql+psycopg://seqae@seqae-postgres:5432/mlflow_auth",
        "admin_username": mlflow_server.ADMIN,
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
    }
    # The sweep drivers run in the head container: they log as the admin the server creates,
    # with the password it creates the admin with.
    drivers = env_of(head["ray-head"])
    assert drivers["MLFLOW_TRACKING_USERNAME"]["value"] == mlflow_server.ADMIN
    assert drivers["MLFLOW_TRACKING_PASSWORD"]["valueFrom"] == env["MLFLOW_AUTH_ADMIN_PASSWORD"]["valueFrom"]


def test_only_the_driver_holds_mlflows_password():
    """As on `seqae cluster up`: the workers and the job's submitter never talk to MLflow."""
    cluster, job = by_kind("RayCluster"), by_kind("RayJob")
    head = env_of(containers(cluster, "head")["ray-head"])
    for where, doc in [(w, cluster) for w in pod_templates(cluster) if w != "head"] + [("submitter", job)]:
        for container in containers(doc, where).values():
            env = env_of(container)
            assert not [n for n in env if n.startswith("MLFLOW_")], where
            if where != "submitter":  # a worker has the head's settings, less MLflow's user
                assert env == {n: e for n, e in head.items() if not n.startswith("MLFLOW_")}


def test_kuberay_manifests_set_what_the_code_reads():
    cluster = by_kind("RayCluster")
    head = env_of(containers(cluster, "head")["ray-head"])
    worker = env_of(containers(cluster, "worker-gpu")["ray-worker"])
    read_by_code = _env_names_read_by_code()
    for env in (head, worker):
        assert {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "SEQAE_STORAGE"} <= env.keys()
        assert {n for n in env if n.startswith("SEQAE_")} <= read_by_code
    head_env = {n: e.get("value") for n, e in head.items()}
    assert head_env["SEQAE_OPTUNA_STORAGE"].startswith("postgresql+psycopg://") and "@" in head_env["SEQAE_OPTUNA_STORAGE"]
    assert head_env["SEQAE_STORAGE"].startswith("s3://")
    # the RayJob's entrypoint is a valid seqae command on a sweep file that exists
    job = by_kind("RayJob")["spec"]
    argv = shlex.split(job["entrypoint"])
    assert argv[:3] == ["python", "-m", "seqae_cli"]
    from seqae_cli.parser import build_parser

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
    """The Dockerfile's base is Ray's image at the Ray this test runs (and raycluster.yaml's
    rayVersion) and this Python; it installs seqae's packages, Ray pinned to the same version, inside
    pyproject.toml's range; and its documented tag is the one every pod of the manifests runs."""
    import sys

    import ray
    import tomllib
    from packaging.requirements import Requirement

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
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY --chown=ray:users (\w+) ", dockerfile, re.M))
    assert copied == {p.rstrip("*") for p in packages}, "the image installs every package pyproject.toml names"
    (built,) = re.findall(r"docker build -f cluster/kuberay/Dockerfile -t (\S+) \.", dockerfile)
    assert built.endswith(f":{project['version']}")
    images = {c["image"] for _, doc in documents() if doc["apiVersion"].startswith("ray.io/")
              for template in pod_templates(doc).values() for c in template["spec"]["containers"]}
    assert images == {built}
