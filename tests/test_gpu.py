"""The training step on CUDA, each test beside its CPU twin (the same test on the CPU, which CI
runs): training against the plain loop, bf16 against fp32 of the same seed, no host sync, the
fused head. The CUDA ones carry the ``gpu`` marker and are skipped, with one reason, where torch
sees no GPU; the GPU check (benchmarks/gpu_check.sh) runs them on one."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from benchmarks.syncs import count_per_step
from seqae_core.config import from_flat
from seqae_core.loss import GPU_CHUNK_ROWS, HeadPlan, liger_available, linear_cross_entropy, plan_head
from seqae_core.model import ReducingAutoencoder
from seqae_core.step import TrainStep
from tests.oracles import reference_cross_entropy

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
VOCAB = 500


def _model_and_batches(device: str, block: str = "paper"):
    config = from_flat({"data.input_len": 32, "model.block": block, "model.heads": 1 if block == "paper" else 2,
                        "model.d_model": 32, "model.d_attn": 32, "model.d_ffn": 64, "train.batch_size": 8})
    torch.manual_seed(0)
    model = ReducingAutoencoder(config, VOCAB).to(device)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(1, VOCAB, (8, 32), generator=generator) for _ in range(4)]
    for b in batches:
        b[0, 20:] = 0  # a padded window in each batch
    return model, [b.to(device) for b in batches]


def _losses(device: str, plan: HeadPlan, bf16: bool, steps: int = 8) -> list[float]:
    model, batches = _model_and_batches(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    step = TrainStep(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0), plan=plan,
                     autocast=lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=bf16), pad_id=0,
                     device=torch.device(device))
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


@pytest.mark.parametrize("device", DEVICES)
def test_the_step_makes_no_host_sync(device):
    """On CUDA, torch's own check raises at any sync inside the steps (Liger-Kernel's fused head
    reads its token count back once a step: it is held to that one); on the CPU the dispatch
    counter finds what a GPU would sync on."""
    for plan in _plans(device):
        model, batches = _model_and_batches(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        step = TrainStep(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0), plan=plan,
                         autocast=lambda: torch.autocast(device, dtype=torch.bfloat16), pad_id=0,
                         device=torch.device(device))
        if device == "cpu":
            syncs, _, by_name = count_per_step(lambda: step(batches[0]), steps=3)
            assert syncs == 0, (plan, by_name)
            continue
        step(batches[0])  # the first step allocates the optimizer's state: not the steady state
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for batch in batches[1:]:
                    step(batch)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message) for w in caught) / (len(batches) - 1)
        assert syncs == (1 if plan.kind == "fused" else 0), (plan, [str(w.message) for w in caught])


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
