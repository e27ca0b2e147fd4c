"""Metric names, in one place, and the padding-aware scores behind them."""

from __future__ import annotations

from dataclasses import dataclass

# Reported after every epoch.
EPOCH = "epoch"
TRAIN_LOSS = "train_loss"
VAL_LOSS = "val_loss"
VAL_TOKEN_ACCURACY = "val_token_accuracy"
VAL_SEQUENCE_ACCURACY = "val_sequence_accuracy"
LEARNING_RATE = "lr"
TOKENS_PER_S = "tokens_per_s"
EPOCH_SECONDS = "epoch_seconds"
RESOURCE_SECONDS = "resource_seconds"  # a sweep trial's training wall time x the CPUs or GPU fraction it held
LATENT_FRACTION = "latent_fraction"  # latent_len / input_len, constant per trial
BEST_EPOCH = "best_epoch"
BEST_VAL_TOKEN_ACCURACY = "best_val_token_accuracy"
# The kept checkpoint's (the best epoch's so far) scores on the test pages, which nothing selects
# on: scored each time early stopping keeps a new best, so a trial has them however it ends.
TEST_LOSS = "test_loss"
TEST_TOKEN_ACCURACY = "test_token_accuracy"
TEST_SEQUENCE_ACCURACY = "test_sequence_accuracy"
TEST_METRICS: tuple[str, ...] = (TEST_LOSS, TEST_TOKEN_ACCURACY, TEST_SEQUENCE_ACCURACY)
GLOBAL_STEP = "global_step"  # optimizer steps since the start, at the end of the epoch
# The epoch's points of the training-loss curve: [global step, mean loss over the steps since the
# previous point] every train.log_every_steps steps; in MLflow, one value per point at its global step.
TRAIN_LOSS_STEPS = "train_loss_steps"
# MLflow's own system metrics (``system/cpu_utilization_percentage``, ...): a sweep's workers
# sample them with MLflow's monitors and record each epoch's means; MLflow's UI shows them apart.
SYSTEM_PREFIX = "system/"

DATA_SECONDS = "data_seconds"  # this process's data start-up: a cache hit takes well under a second
GPU_MEMORY_GIB = "gpu_memory_gib"  # on CUDA: the most GPU memory this trial's tensors held so far

# Summaries in the trainer's final result.
EPOCHS_RUN = "epochs_run"
STOPPED_EARLY = "stopped_early"
TRAIN_SECONDS = "train_seconds"

PER_EPOCH: tuple[str, ...] = (
    EPOCH, TRAIN_LOSS, VAL_LOSS, VAL_TOKEN_ACCURACY, VAL_SEQUENCE_ACCURACY, LEARNING_RATE, TOKENS_PER_S,
    EPOCH_SECONDS, LATENT_FRACTION, BEST_EPOCH, BEST_VAL_TOKEN_ACCURACY, DATA_SECONDS, GLOBAL_STEP,
)
CUDA_PER_EPOCH: tuple[str, ...] = (GPU_MEMORY_GIB,)  # reported besides those on CUDA only
# Reported besides those with a test split (data.test_fraction > 0): TEST_METRICS.
# What a sweep may optimize, and the direction that makes sense for each.
OBJECTIVES: dict[str, tuple[str, ...]] = {
    VAL_TOKEN_ACCURACY: ("max",),
    VAL_SEQUENCE_ACCURACY: ("max",),
    VAL_LOSS: ("min",),
    TRAIN_LOSS: ("min",),
    LATENT_FRACTION: ("min", "max"),
    TOKENS_PER_S: ("max",),
}
# Early stopping watches this one (the paper's patience of 5 epochs).
MONITOR = VAL_TOKEN_ACCURACY  # higher is better


@dataclass
class Scores:
    """Sums over non-pad tokens; add batches, then read the means."""

    loss_sum: float = 0.0
    tokens: int = 0
    correct: int = 0
    sequences: int = 0
    exact: int = 0

    def add(self, other: Scores) -> None:
        self.loss_sum += other.loss_sum
        self.tokens += other.tokens
        self.correct += other.correct
        self.sequences += other.sequences
        self.exact += other.exact

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.tokens, 1)

    @property
    def token_accuracy(self) -> float:
        return self.correct / max(self.tokens, 1)

    @property
    def sequence_accuracy(self) -> float:
        return self.exact / max(self.sequences, 1)
