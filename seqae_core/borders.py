"""The untyped dicts at seqae's borders, each named for the library whose API hands or takes it.

Inside seqae a record is a dataclass (an :class:`~seqae_core.epoch.EpochRecord`, a
``TrialSpec``); where a library's own signature is ``dict[str, Any]`` the value crosses as one of
these names, so that a reader sees which library it belongs to and ``python -m research.house``
counts each border by name. None is a record of seqae's own: that would be a dataclass."""

from __future__ import annotations

from typing import Any, TypeAlias

# A result as Ray Tune hands it to a Stopper, a TrialScheduler's on_trial_result and a Callback
# (seqae's part of it is read back into a typed record by sweeps.running.tune_result.of_tune).
TuneResult: TypeAlias = dict[str, Any]
# A trial's config as Ray Tune copies it to the trial's worker (sweeps.spec.trial.WorkerSpec's form).
TuneConfig: TypeAlias = dict[str, Any]
# What Python's pickle protocol passes through __getstate__ / __setstate__.
PickleState: TypeAlias = dict[str, Any]
# What torch's state_dict, torch.save and torch.load, and the RNGs' get_state pass.
TorchState: TypeAlias = dict[str, Any]
# A YAML or JSON mapping as PyYAML or json loads it, before a pydantic schema validates it.
Document: TypeAlias = dict[str, Any]
# A study's or trial's user or system attributes, JSON values that Optuna's storage keeps untyped.
OptunaAttrs: TypeAlias = dict[str, Any]
# The inference params MLflow's PythonModel.predict is handed (a model signature's params schema).
MlflowParams: TypeAlias = dict[str, Any]
