"""The names seqae's records are found by in MLflow and Optuna, stated once: MLflow tags on
experiments and runs, Optuna user attributes on studies and trials. (Metric names are
:mod:`seqae_core.metrics`.) Plain strings: the sweep service writes them, the report, the UI and
the benchmarks read them."""

from __future__ import annotations

# MLflow tags
SWEEP = "seqae.sweep"  # experiment and runs: the sweep's name
OWNER = "seqae.owner"  # experiment, runs, registered model and study (a user attribute): the user the sweep belongs to
FINGERPRINT = "seqae.fingerprint"  # experiment and study: the sweep file's fingerprint (one sweep per experiment)
# experiment: `seqae sweep delete` deleted its sweep through a tracking server, whose rows wait for
# `seqae cluster gc`
DELETED = "seqae.deleted"
ROLE = "seqae.role"  # the sweep's parent run: "sweep"
ROLE_SWEEP = "sweep"
TRIAL = "seqae.trial"  # a trial's run: the Optuna trial number
RESOURCE = "seqae.resource"  # a trial's run: "cpu" or "gpu", the unit of its resource_seconds
OUTCOME = "seqae.outcome"  # a trial's run: complete, pruned, failed or interrupted (the run's status is MLflow's)
ENDED = "seqae.ended"  # the sweep's parent run: how its last session ended (complete, or why it stopped early)
BEST_ALIAS = "best"  # the registered model's alias on the version of the sweep's best trial
MODEL_EPOCH = "seqae.epoch"  # a registered model version: the epoch of its trial's checkpoint it holds
OBJECTIVE = "seqae.objective."  # ... + a metric: a version of a multi-objective sweep's front, its operating point
LATENT_ALIAS = "latent-"  # a front version's alias: its latent share in percent (latent_alias)


def latent_alias(share: float) -> str:
    """The alias of a front model at latent ``share``: ``latent-25pct``, ``latent-12_5pct`` (MLflow's
    aliases take no dots)."""
    return f"{LATENT_ALIAS}{share * 100:g}pct".replace(".", "_")


OPTUNA_TRIAL = "optuna.trial_number"  # a trial's run: its Optuna trial number, as Optuna's MLflow callback names it
OPTUNA_STATE = "optuna.state"  # ... the trial's Optuna state, on runs closed before OUTCOME existed
ERROR = "seqae.error"  # a failed trial's run: the end of its traceback
CONTINUED = "seqae.continued"  # a trial's run reopened by `seqae sweep extend --epochs`
# a failed attempt's run, retired by `seqae sweep retry`: the trial number it was (its seqae.trial gone)
ATTEMPT_OF = "seqae.attempt_of"
RETRIED_BY = "seqae.retried_by"  # ... the run id of the attempt that retried it
RETRY_OF_RUN = "seqae.retry_of_run"  # a retried trial's run: the run id of the failed attempt it retries
ARTIFACTS_EPOCH = "seqae.artifacts_epoch"  # a trial's run: the epoch whose best-model artifacts it holds
CODE = "seqae.code"  # every run of a sweep: the digest of the product code its session ran
CODE_DIRTY = "seqae.code_dirty"  # ... "true" where that code had uncommitted changes
VERSION = "seqae.version."  # ... + a package: the version of it the session ran
TUNE_TRIAL_ID = "ray.tune_trial_id"  # a trial's run: the Ray Tune trial that ran it in this session
NODE = "ray."  # ... + node_id, node_ip, hostname: where Ray ran the trial (NODE_ID, NODE_IP below)
NODE_ID = NODE + "node_id"
NODE_IP = NODE + "node_ip"
HOSTNAME = NODE + "hostname"
GPU = "seqae.gpu"  # a trial's run that Ray gave a GPU: "cuda", or "logical" (trained on the CPU: SEQAE_LOGICAL_GPUS)
GPU_IDS = "ray.gpu_ids"  # ... the ids ray.get_gpu_ids() gave it, comma-separated
CUDA_VISIBLE_DEVICES = "ray.cuda_visible_devices"  # ... and the CUDA_VISIBLE_DEVICES Ray set from them

# Optuna user attributes
CONTROL = "seqae.control"  # the study's: SweepStudy.control()
FORKED = "seqae.forked_from"  # a seeded trial's: "<origin sweep>#<its trial number>"
CONTINUES = "seqae.continues"  # the newer record of a continued trial: the sweep trial's number
EPOCHS = "seqae.epochs"  # ... and the epoch limit it trains on to
START = "seqae.start"  # a starting point's trial (Optuna attribute and MLflow tag): its name in the sweep file
TRAINED = "seqae.trained"  # a trial's: the epochs it had trained at its latest result (1.25 between epochs' ends)
PROPOSED_BY = "seqae.proposed_by"  # a trial's: "start", "grid", "random start-up", or the sampler that proposed it
TEST = "seqae.test"  # a trial's: the test metrics of the checkpoint it kept (with a test split)
SEEDS = "seqae.seeds"  # a trial's of several seeds (train.repeats): each seed's value and the standard error at the kept epoch
# a finished trial's (with constraints): how far the kept checkpoint is outside each bound, 0 or less inside
CONSTRAINTS = "seqae.constraints"
CREATED = (
    "seqae.created"  # every trial's (a system attribute): the token its creation is found by, should the answer be lost
)
TUNE_TRIAL_IDS = "seqae.tune_trial_ids"  # a trial's: the Ray Tune trial ids that ran it, one per session
STOP = "seqae.stop"  # a running trial's: `seqae sweep stop --trial` asked it to stop (by whom, when, whether --now)
ATTEMPT = (
    "seqae.attempt"  # a retried trial's (Optuna attribute and MLflow tag): which attempt at its configuration, from 2
)
RETRY_OF = "seqae.retry_of"  # ... the Optuna trial number of the failed attempt it retries
