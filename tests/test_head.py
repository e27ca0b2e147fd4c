"""The vocabulary head's ways against the plain cross-entropy, and a training step with no host
sync and one compiled graph, all on the CPU (the GPU's settings too: the chunk size is the plan's)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from benchmarks.syncs import count_per_step
from seqae_core.config import from_flat
from seqae_core.loss import CPU_CHUNK_ROWS, GPU_CHUNK_ROWS, IGNORE, HeadPlan, linear_cross_entropy, plan_head
from seqae_core.model import ReducingAutoencoder
from seqae_core.step import TrainStep, fill_batch
from seqae_errors import ConfigError
from tests.oracles import reference_cross_entropy

HEADS = [
    pytest.param(HeadPlan("chunked", CPU_CHUNK_ROWS), id="chunked-cpu-rows"),
    pytest.param(HeadPlan("chunked", GPU_CHUNK_ROWS), id="chunked-gpu-rows"),
    pytest.param(HeadPlan("chunked", 7), id="chunked-7-rows"),  # many blocks and a partial last one
    pytest.param(HeadPlan("dense", 0), id="dense"),
]


def _inputs(rows: int, pads: int | str, vocab: int = 700, d: int = 24):
    torch.manual_seed(0)
    head = torch.nn.Linear(d, vocab)
    hidden = torch.randn(rows, d, requires_grad=True)
    targets = torch.randint(0, vocab, (rows,))
    if pads == "all":
        targets[:] = IGNORE
    else:
        targets[torch.randperm(rows)[:pads]] = IGNORE
    return head, hidden, targets


def _loss_and_grads(fn, head, hidden, targets):
    hidden.grad, head.weight.grad, head.bias.grad = None, None, None
    loss, predicted = fn(hidden, head, targets)
    loss.backward()
    return loss.detach(), predicted, hidden.grad, head.weight.grad, head.bias.grad


@pytest.mark.parametrize("plan", HEADS)
@pytest.mark.parametrize("pads", [0, 37, "all"], ids=["no-pads", "37-pads", "all-pad"])
def test_every_head_matches_the_reference_in_fp32(plan, pads):
    head, hidden, targets = _inputs(300, pads)
    loss, predicted, *grads = _loss_and_grads(
        lambda h, w, t: linear_cross_entropy(h, w, t, plan), head, hidden, targets
    )
    ref_loss, ref_predicted, *ref_grads = _loss_and_grads(reference_cross_entropy, head, hidden, targets)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert torch.equal(predicted, ref_predicted)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if pads == "all":  # nothing is scored: no loss, no gradient, and never a NaN
        assert loss.item() == 0.0 and all(g.abs().max().item() == 0.0 for g in grads)


@pytest.mark.parametrize("plan", HEADS)
def test_every_head_matches_the_reference_under_bf16_autocast(plan):
    head, hidden, targets = _inputs(200, 23, vocab=500, d=32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = linear_cross_entropy(hidden, head, targets, plan)
    reference, _ = reference_cross_entropy(hidden, head, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference.detach(), rtol=2e-2, atol=0)
    loss.backward()
    assert hidden.grad is not None and hidden.grad.dtype == torch.float32


def test_the_head_is_planned_once_from_the_config_and_the_device():
    assert plan_head("auto", torch.device("cpu")) == HeadPlan("chunked", CPU_CHUNK_ROWS)
    assert plan_head("dense", torch.device("cpu")).kind == "dense"
    assert plan_head("chunked", torch.device("cuda")) == HeadPlan("chunked", GPU_CHUNK_ROWS)
    with pytest.raises(ConfigError, match=r"^train.head=fused runs on CUDA only"):
        plan_head("fused", torch.device("cpu"))
    assert HeadPlan("fused", GPU_CHUNK_ROWS).scoring == HeadPlan("chunked", GPU_CHUNK_ROWS)  # argmax to score


def _step(plan: HeadPlan, backend=None, block: str = "transformer", batch: int = 8, length: int = 16):
    config = from_flat(
        {
            "data.input_len": length,
            "model.block": block,
            "model.d_model": 32,
            "model.d_attn": 32,
            "model.heads": 2,
            "model.d_ffn": 64,
            "train.batch_size": batch,
        }
    )
    torch.manual_seed(0)
    model = ReducingAutoencoder(config, 300)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    step = TrainStep(
        model,
        optimizer,
        scheduler,
        plan=plan,
        autocast=lambda: torch.autocast("cpu", enabled=False),
        pad_id=0,
        device=torch.device("cpu"),
        backend=backend,
    )
    tokens = torch.randint(1, 300, (batch, length))
    tokens[0, 9:] = 0  # a padded window
    return step, tokens


@pytest.mark.parametrize(
    "plan",
    [HeadPlan("chunked", CPU_CHUNK_ROWS), HeadPlan("chunked", GPU_CHUNK_ROWS), HeadPlan("dense", 0)],
    ids=["chunked-cpu-rows", "chunked-gpu-rows", "dense"],
)
def test_a_training_step_makes_no_host_sync(plan):
    """Between two reads of a window, no operator makes the host wait: counted as a GPU would
    sync (scalar reads, nonzero, boolean-mask indexing), on the CPU. The read itself is one."""
    step, tokens = _step(plan)
    syncs, ops, by_name = count_per_step(lambda: step(tokens), steps=3)
    assert syncs == 0, by_name
    assert ops > 0  # the counter saw the step
    _, _, by_name = count_per_step(step.read, steps=1, warmup=0)
    assert sum(by_name.values()) == 1, by_name


@pytest.mark.parametrize("plan", [HeadPlan("chunked", CPU_CHUNK_ROWS), HeadPlan("dense", 0)], ids=["chunked", "dense"])
@pytest.mark.parametrize("block", ["paper", "transformer"])
def test_the_compiled_step_is_one_graph_traced_once(plan, block):
    """fullgraph=True makes a graph break an error; the counter makes a recompilation one: steps
    with other tokens, pads, and a short last batch filled to the batch's shape reuse one graph."""
    counter = CompileCounter()
    step, tokens = _step(plan, backend=counter, block=block)
    for i in range(4):
        step(tokens.roll(i, dims=1))
    step(fill_batch(tokens[:3], 8, pad_id=0))
    assert counter.frame_count == 1 and counter.op_count > 0
    window = step.read()
    assert window.bad_step == 0 and window.tokens == 4 * (8 * 16 - 7) + (3 * 16 - 7)  # pads and filled rows: none


def test_a_non_finite_loss_is_found_at_the_read_and_named_by_its_step():
    step, tokens = _step(HeadPlan("dense", 0))
    step(tokens)
    with torch.no_grad():
        step.model.head.bias[0] = float("nan")
    step(tokens)
    step(tokens)
    window = step.read()
    assert window.bad_step == 2


def test_two_epochs_agree_with_the_trainer_as_it_was(tiny_config, data_cache):
    """The sync-free trainer (pads weighted 0, scores summed on the device) against the plain loop
    of the trainer before it (pads indexed out, scores read every step): the paper block, fp32,
    no dropout, two epochs, the same validation scores within 1e-5."""
    from seqae_core import data
    from seqae_core.train import train
    from tests.oracles import reference_training

    config = tiny_config(
        **{"model.block": "paper", "model.heads": 1, "train.precision": "fp32", "train.epochs": 2, "train.lr": 3e-3}
    )
    reports = []
    train(config, lambda m, c: reports.append(m.as_dict()), cache_dir=data_cache, device="cpu")
    want = reference_training(config, data.load(config.data, data_cache), epochs=2)
    assert len(reports) == 2 and reports[1]["val_loss"] < reports[0]["val_loss"]  # it trained
    for got, expected in zip(reports, want):
        assert got["val_loss"] == pytest.approx(expected["val_loss"], rel=1e-5)
        assert got["val_token_accuracy"] == pytest.approx(expected["val_token_accuracy"], abs=1e-5)


def test_a_compiled_run_reports_its_compile_time_once(tiny_config, data_cache, monkeypatch):
    """train.compile=on: the first step's seconds (the compilation in them) in epoch 1's metrics
    and the final ones, not in later epochs'. A counting backend stands in for inductor, whose
    C++ build would take minutes on two cores; the graph is the same one."""
    from seqae_core import step as step_lib
    from seqae_core.train import train

    counter = CompileCounter()
    real = step_lib.TrainStep.__init__

    def with_counter(self, *args, backend=None, **kwargs):
        real(self, *args, backend=counter if backend is not None else None, **kwargs)

    monkeypatch.setattr(step_lib.TrainStep, "__init__", with_counter)
    reports = []
    final = train(
        tiny_config(**{"train.compile": "on", "train.epochs": 2}),
        lambda m, c: reports.append(m.as_dict()),
        cache_dir=data_cache,
    )
    assert counter.frame_count == 1  # one graph for every batch, the short last one filled
    assert reports[0]["compile_seconds"] > 0 and "compile_seconds" not in reports[1]
    assert final["compile_seconds"] == reports[0]["compile_seconds"]
