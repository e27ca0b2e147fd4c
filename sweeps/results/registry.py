"""Loading a sweep's registered model (`seqae encode`, ``Sweep.best_model()``): a version of the
MLflow model registry, by number or alias, built by the installed :mod:`sweeps.stores.textmodel`
from the version's artifacts alone; the model file and code paths stored beside them never run."""

from __future__ import annotations

import tempfile
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_errors import ConfigError
from sweeps.stores import textmodel
from sweeps.stores.mlflow_access import fluent_uri
from sweeps.stores.workspace import redact


def load_registered(tracking_uri: str, model: str, at: float | None = None) -> tuple[str, textmodel.LoadedModel]:
    """A registered model version, given as ``NAME`` (the version its sweep's ``@best`` alias
    points at, else the newest; with ``at``, the front's model of the largest latent share at most
    ``at``), ``NAME/VERSION`` or ``NAME@ALIAS``, with or without ``models:/``:
    ``(its models:/ URI, the model)``, the model built from its artifacts (:func:`_from_artifacts`).
    :class:`ConfigError` naming ``model`` if the registry at ``tracking_uri`` has no such version."""

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    name, at_sign, alias = model.removeprefix("models:/").partition("@")
    name, _, version = name.partition("/")
    where = f"in the model registry at {redact(tracking_uri)}"
    if not name or "'" in name or (version and not version.isdigit()) or (version and at_sign):
        raise ConfigError(f"model {model!r}: expected NAME, NAME/VERSION or NAME@ALIAS (optionally after models:/)")
    if at is not None and (version or at_sign):
        raise ConfigError(f"model {model!r}: --at chooses the version by its latent share; give NAME alone")
    try:
        versions = client.search_model_versions(f"name = '{name}'")
        if not versions:
            known = ", ".join(sorted(m.name for m in client.search_registered_models())) or "none"
            raise ConfigError(f"model {model!r}: no registered model named {name!r} {where} (registered: {known})")
        if at is not None:
            version = _by_size(client, name, at, model)
        elif at_sign:
            aliases = sorted({a for v in versions for a in v.aliases})
            if alias not in aliases:
                raise ConfigError(
                    f"model {model!r}: {name!r} has no alias {alias!r} {where} "
                    f"(aliases: {', '.join('@' + a for a in aliases) or 'none'})"
                )
            version = client.get_model_version_by_alias(name, alias).version
        elif not version:
            version = next((v.version for v in versions if N.BEST_ALIAS in v.aliases), "")
    except MlflowException as exc:
        raise ConfigError(f"model {model!r}: {exc.message} ({where})") from None
    numbers = sorted(int(v.version) for v in versions)
    if version and int(version) not in numbers:
        raise ConfigError(
            f"model {model!r}: {name!r} has no version {version} {where} (versions: {', '.join(map(str, numbers))})"
        )
    uri = f"models:/{name}/{version or numbers[-1]}"
    with fluent_uri(tracking_uri):
        return uri, _from_artifacts(uri, model, where)


def _from_artifacts(uri: str, model: str, where: str) -> textmodel.LoadedModel:
    """The model at ``uri`` (``models:/NAME/VERSION``, in the fluent API's registry) built by the
    installed code from the artifacts it reads as data (weights, config, tokenizer files, token
    ids), fetched without the rest of the logged model. Not ``mlflow.pyfunc.load_model``, which
    runs the model file stored beside them and puts the stored code paths first on ``sys.path``."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            folder = Path(mlflow.artifacts.download_artifacts(f"{uri}/{textmodel.ARTIFACTS}", dst_path=tmp))
        except MlflowException as exc:
            raise ConfigError(
                f"model {model!r}: cannot read {uri}/{textmodel.ARTIFACTS} {where} ({str(exc).splitlines()[-1]})"
            ) from None
        paths = {name: folder / file for name, file in textmodel.FILES.items()}
        missing = [f"{textmodel.ARTIFACTS}/{path.name}" for path in paths.values() if not path.exists()]
        if missing:
            raise ConfigError(f"model {model!r}: {uri} has no {', '.join(missing)} {where}: not a seqae model")
        return textmodel.LoadedModel({name: str(path) for name, path in paths.items()})


def _by_size(client: MlflowClient, name: str, at: float, model: str) -> str:
    """The version of ``name``'s Pareto front (its ``latent-`` aliases) with the largest latent share
    at most ``at``."""
    shares: dict[float, str] = {}
    for alias, version in client.get_registered_model(name).aliases.items():
        if alias.startswith(N.LATENT_ALIAS):
            tags = client.get_model_version(name, version).tags
            shares[float(tags[f"{N.OBJECTIVE}{M.LATENT_SHARE}"])] = str(version)
    if not shares:
        raise ConfigError(
            f"model {model!r}: --at {at:g} needs a front registered by latent share (a sweep with "
            f"latent_share among its objectives); {name!r} has none"
        )
    fitting = [share for share in shares if share <= at]
    if not fitting:
        raise ConfigError(
            f"model {model!r}: no model of the front has a latent share at most {at:g} (shares: "
            f"{', '.join(f'{s:g}' for s in sorted(shares))})"
        )
    return shares[max(fitting)]
