"""The training step on CUDA, each test beside its CPU twin (the same test on the CPU, which CI
runs): training against the plain loop, bf16 against fp32 of the same seed, no host sync, the
fused head, and a pack of fused members against each member trained alone. The CUDA ones carry
the ``gpu`` marker and are skipped, with one reason, where torch sees no GPU; the GPU check
(benchmarks/gpu_check.sh) runs them on one."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from benchmarks.syncs import count_per_step
from seqae_core.config import from_flat
from seqae_core.fused import Pack
from seqae_core.loss import GPU_CHUNK_ROWS, HeadPlan, liger_available, linear_cross_entropy, plan_head
from seqae_core.model import ReducingAutoencoder
from seqae_core.schedule import Schedule
from seqae_core.step import TrainStep
from tests.oracles import reference_cross_entropy

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
VOCAB = 500


def _model_and_batches(device: str, block: str = "paper", seed: int = 0):
    config = from_flat(
        {
            "data.input_len": 32,
            "model.block": block,
            "model.heads": 1 if block == "paper" else 2,
            "model.d_model": 32,
            "model.d_attn": 32,
            "model.d_ffn": 64,
            "train.batch_size": 8,
        }
    )
    torch.manual_seed(seed)
    model = ReducingAutoencoder(config, VOCAB).to(device)
    generator = torch.Generator().manual_seed(seed + 1)
    batches = [torch.randint(1, VOCAB, (8, 32), generator=generator) for _ in range(4)]
    for b in batches:
        b[0, 20:] = 0  # a padded window in each batch
    return model, [b.to(device) for b in batches]


def _losses(device: str, plan: HeadPlan, bf16: bool, steps: int = 8) -> list[float]:
    model, batches = _model_and_batches(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    step = TrainStep(
        model,
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        plan=plan,
        autocast=lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=bf16),
        pad_id=0,
        device=torch.device(device),
    )
    losses = []
    for i in range(steps):
        step(batches[i % len(batches)])
        losses.append(step.read().loss)
    return losses


@pytest.fixture
def exact_fp32():
    """fp32 matmuls as fp32 (no TF32), for comparisons at fp32's precision; restored after."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("device", DEVICES)
def test_training_steps_match_the_plain_loop(device, exact_fp32):
    """Eight fp32 steps of seqae's step (its device's head) against the plain loop written from
    the paper (pads indexed out, PyTorch's cross-entropy): the same losses within 1e-4."""
    got = _losses(device, plan_head("auto", torch.device(device)) if device == "cpu" else HeadPlan("dense", 0), False)
    model, batches = _model_and_batches(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    want = []
    for i in range(8):
        tokens = batches[i % len(batches)]
        keep = tokens != 0
        loss = F.cross_entropy(model(tokens)[keep], tokens[keep])
        want.append(loss.item())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert want[-1] < want[0]  # it learned
    assert got == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_a_bf16_step_tracks_fp32_of_the_same_seed(device):
    fp32 = _losses(device, HeadPlan("chunked", GPU_CHUNK_ROWS), False)
    bf16 = _losses(device, HeadPlan("chunked", GPU_CHUNK_ROWS), True)
    assert bf16 == pytest.approx(fp32, rel=5e-2)
    assert bf16[-1] < bf16[0]


def _plans(device: str) -> list[HeadPlan]:
    plans = [HeadPlan("chunked", GPU_CHUNK_ROWS), HeadPlan("dense", 0)]
    return plans + ([HeadPlan("fused", GPU_CHUNK_ROWS)] if device == "cuda" and liger_available() else [])


def _syncs_a_step(
    device: str, step: Callable[[torch.Tensor], None], batches: list[torch.Tensor]
) -> tuple[float, object]:
    """(the host syncs a step makes, what they were) after a first step, which allocates the
    optimizer's state: on CUDA torch's own check warns at every sync; on the CPU the dispatch
    counter finds what a GPU would sync on."""
    if device == "cpu":
        syncs, _, by_name = count_per_step(lambda: step(batches[0]), steps=3)
        return syncs, by_name
    step(batches[0])
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for batch in batches[1:]:
                step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught) / (len(batches) - 1), [str(w.message) for w in caught]


@pytest.mark.parametrize("device", DEVICES)
def test_the_step_makes_no_host_sync(device):
    """No sync inside the steps; Liger-Kernel's fused head (CUDA only) reads its token count back
    once a step: it is held to that one."""
    for plan in _plans(device):
        model, batches = _model_and_batches(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        step = TrainStep(
            model,
            optimizer,
            torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
            plan=plan,
            autocast=lambda: torch.autocast(device, dtype=torch.bfloat16),
            pad_id=0,
            device=torch.device(device),
        )
        syncs, seen = _syncs_a_step(device, step, batches)
        assert syncs == (1 if plan.kind == "fused" else 0), (plan, seen)


# A pack's members as a sweep's would be: each its own lr, weight decay and schedule (lr, decay, schedule).
MEMBERS = [
    (3e-3, 0.01, Schedule(0.1, 6, linear=True)),
    (1e-3, 0.0, Schedule(1.0, 0, linear=False)),
    (2e-3, 0.1, Schedule(0.5, 3, linear=True)),
]
PACK_PLAN = HeadPlan("chunked", GPU_CHUNK_ROWS)


def _members(
    device: str,
) -> list[tuple[ReducingAutoencoder, list[torch.Tensor], torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]]:
    """Each member's model (its own seed), batches, optimizer and schedule, as it trains alone."""
    members = []
    for seed, (lr, decay, schedule) in enumerate(MEMBERS):
        model, batches = _model_and_batches(device, seed=seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=decay, fused=True)
        members.append((model, batches, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)))
    return members


def _pack(device: str, members: list, bf16: bool) -> tuple[Pack, list[torch.Tensor]]:
    """The members as one pack (their weights and fresh optimizer states stacked), and its batches
    (k, b, t): member i's batch at i."""
    models = [model for model, *_ in members]
    pack = Pack(
        models,
        lr=[m[0] for m in MEMBERS],
        weight_decay=[m[1] for m in MEMBERS],
        schedule=[m[2] for m in MEMBERS],
        plan=PACK_PLAN,
        pad_id=0,
        device=torch.device(device),
        autocast=lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=bf16),
    )
    pack.stack(models, [optimizer for *_, optimizer, _ in members], [scheduler for *_, scheduler in members])
    pack.train()
    return pack, [torch.stack(batches) for batches in zip(*(b for _, b, *_ in members))]


@pytest.mark.parametrize("device", DEVICES)
def test_a_pack_trains_each_member_as_it_trains_alone(device, exact_fp32):
    """fp32, no dropout: a pack of three members, each with its own seed, batches, lr, weight decay
    and schedule, against each trained alone by seqae's step: every step's loss of every member
    within 1e-5 on the CPU, and the weights, moments and learning rate the pack writes back into
    each member's own model, optimizer and schedule as training alone left them (weights within
    1e-4: ``test_fused.WEIGHTS_ATOL``'s reason). On CUDA other kernels sum in other orders even
    without TF32: losses within 1e-4 (as the plain loop's test), weights within 1e-3 (Adam carries
    a nearly cancelling gradient's rounding into a weight at up to the lr a step)."""
    members = _members(device)
    unstacked = [copy.deepcopy((model, optimizer, scheduler)) for model, _, optimizer, scheduler in members]
    pack, batches = _pack(device, members, bf16=False)
    steps = 8
    fused = []
    for i in range(steps):
        pack(batches[i % len(batches)])
        fused.append([window.loss for window in pack.read()])
    pack.unstack(*(list(column) for column in zip(*unstacked)))
    alone = []
    for model, member_batches, optimizer, scheduler in members:
        step = TrainStep(
            model,
            optimizer,
            scheduler,
            plan=PACK_PLAN,
            autocast=lambda: torch.autocast(device, enabled=False),
            pad_id=0,
            device=torch.device(device),
        )
        losses = []
        for i in range(steps):
            step(member_batches[i % len(member_batches)])
            losses.append(step.read().loss)
        alone.append(losses)
    rel, weights_atol, moments_rtol = (1e-5, 1e-4, 1e-4) if device == "cpu" else (1e-4, 1e-3, 1e-3)
    for j, losses in enumerate(alone):
        assert losses[-1] < losses[0]  # each member learned
        assert [row[j] for row in fused] == pytest.approx(losses, rel=rel), f"member {j}"
    assert len({round(losses[-1], 4) for losses in alone}) == len(MEMBERS)  # and each its own way
    for (model, _, optimizer, scheduler), (written, written_optimizer, written_scheduler) in zip(members, unstacked):
        torch.testing.assert_close(written.state_dict(), model.state_dict(), atol=weights_atol, rtol=0)
        torch.testing.assert_close(
            written_optimizer.state_dict()["state"], optimizer.state_dict()["state"], atol=1e-5, rtol=moments_rtol
        )
        assert written_scheduler.get_last_lr() == pytest.approx(scheduler.get_last_lr(), rel=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_a_packs_step_makes_no_host_sync(device):
    """The pack's step (the members' vmapped forward, their heads, one backward, each member's
    fused AdamW) queues its kernels and returns: no sync inside it, in bf16 as a GPU trains."""
    pack, batches = _pack(device, _members(device), bf16=True)
    syncs, seen = _syncs_a_step(device, pack, batches)
    assert syncs == 0, seen


@pytest.mark.gpu
def test_the_fused_head_matches_the_reference_on_cuda(exact_fp32):
    """Liger-Kernel's head against the plain cross-entropy (the CPU twins: test_head.py's heads)."""
    if not liger_available():
        pytest.fail('Liger-Kernel is not installed: pip install -e ".[gpu]" (the GPU kit carries it)')
    torch.manual_seed(0)
    head = torch.nn.Linear(256, 30522).cuda()
    hidden = torch.randn(1024, 256, device="cuda", requires_grad=True)
    targets = torch.randint(0, 30522, (1024,), device="cuda")
    targets[::5] = -100
    loss, _ = linear_cross_entropy(hidden, head, targets, HeadPlan("fused", GPU_CHUNK_ROWS), predict=False)
    loss.backward()
    got = [t.detach().clone() for t in (loss, hidden.grad, head.weight.grad, head.bias.grad) if t is not None]
    hidden.grad, head.weight.grad, head.bias.grad = None, None, None
    reference, _ = reference_cross_entropy(hidden, head, targets)
    reference.backward()
    want = [reference.detach(), hidden.grad, head.weight.grad, head.bias.grad]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
