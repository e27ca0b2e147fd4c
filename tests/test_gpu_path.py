"""The GPU path's logic, on CPU: precision choice, bf16 training and attention, the FLOP count
behind MFU, and fractional GPU resources (no GPU is needed to check what is asked of one)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.flops import forward_flops, head_share
from seqae.cli.main import main
from seqae_core import device as device_lib
from seqae_core.device import autocast_dtype, describe_precision
from seqae_core.model import attention
from seqae_core.train import train
from seqae_errors import ConfigError
from sweeps.spec import sweep as spec_lib
from tests.oracles import reference_attention
from tests.refusal import assert_refused
from tests.sweep_helpers import SMOKE, STUDIES


@pytest.mark.parametrize(
    "precision, device, cpu_flags, expected, said",
    [
        pytest.param("auto", "cuda", [], torch.bfloat16, "bf16 autocast (CUDA)", id="auto-on-cuda-is-bf16"),
        pytest.param("auto", "cpu", [], None, "fp32 (this CPU has no native bf16)", id="auto-on-plain-cpu-is-fp32"),
        pytest.param(
            "auto",
            "cpu",
            ["avx512_bf16"],
            torch.bfloat16,
            "bf16 autocast (this CPU has avx512_bf16)",
            id="auto-on-bf16-cpu-is-bf16",
        ),
        pytest.param("bf16", "cpu", [], torch.bfloat16, "bf16 autocast", id="bf16-asked-on-cpu"),
        pytest.param("fp32", "cuda", [], None, "fp32", id="fp32-asked-on-cuda"),
        pytest.param("fp32", "cpu", ["amx_bf16"], None, "fp32", id="fp32-asked-on-bf16-cpu"),
    ],
)
def test_precision_follows_the_device(tiny_config, monkeypatch, precision, device, cpu_flags, expected, said):
    monkeypatch.setattr(device_lib, "native_bf16_flags", lambda: cpu_flags)
    config = tiny_config(**{"train.precision": precision})
    assert autocast_dtype(config, torch.device(device)) is expected
    assert describe_precision(config, torch.device(device)) == said


def test_native_bf16_flags_read_this_machine():
    """On Linux the flags come from /proc/cpuinfo, read here on its own: the answer is the bf16
    sets the CPU lists, on a machine with them and on one without; where there are some, oneDNN
    agrees that bf16 is supported."""
    with open("/proc/cpuinfo") as f:
        listed = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    flags = device_lib.native_bf16_flags()
    assert flags == [f for f in ("avx512_bf16", "amx_bf16") if f in listed]
    if flags and torch.backends.mkldnn.is_available():
        assert torch.ops.mkldnn._is_mkldnn_bf16_supported()


def test_bf16_training_tracks_fp32_of_the_same_seed_on_cpu(tiny_config, data_cache):
    """The CPU twin of the GPU path: the same autocast and head, in bf16, learns as fp32 does from
    the same seed (tests/test_gpu.py holds the step to that on CUDA)."""
    runs = {}
    for precision in ("bf16", "fp32"):
        reports = []
        train(
            tiny_config(**{"train.precision": precision, "train.epochs": 2, "train.lr": 0.003}),
            lambda m, c, reports=reports: reports.append(m.as_dict()),
            cache_dir=data_cache,
        )
        runs[precision] = reports
    bf16, fp32 = runs["bf16"], runs["fp32"]
    assert bf16[-1]["train_loss"] < bf16[0]["train_loss"]
    for b, f in zip(bf16, fp32):
        assert b["train_loss"] == pytest.approx(f["train_loss"], rel=0.05)
        assert b["val_token_accuracy"] == pytest.approx(f["val_token_accuracy"], abs=0.03)


def test_fused_attention_in_bf16_matches_fp32_reference():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 20, 16), torch.randn(2, 4, 20, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused.float(), reference_attention(q, k, v), rtol=3e-2, atol=3e-2)


def test_flop_count_behind_mfu(tiny_config):
    config = tiny_config(
        **{
            "model.block": "paper",
            "model.layers": 1,
            "data.input_len": 16,
            "model.latent_len": 8,
            "model.d_model": 32,
            "model.d_attn": 32,
        }
    )
    head, body = forward_flops(config, 100)
    assert head == 2 * 16 * 32 * 100
    # encoder 16 -> 8 and decoder 8 -> 16: W_S x, Q, K and V, scores, weighted values, W_O
    enc = 2 * (8 * 16 * 32 + 8 * 32 * 32 + 2 * 16 * 32 * 32 + 2 * 8 * 16 * 32 + 8 * 32 * 32)
    dec = 2 * (16 * 8 * 32 + 16 * 32 * 32 + 2 * 8 * 32 * 32 + 2 * 16 * 8 * 32 + 16 * 32 * 32)
    assert body == enc + dec
    assert head_share(config, 100) == head / (head + body)


def test_fractional_gpus_are_valid_and_a_gpu_sweep_without_gpus_is_refused(tmp_path, capsys):
    spec = spec_lib.load(STUDIES / "quickstart.yaml", ["resources.gpu=0.25"])
    assert spec.resources.gpu == 0.25  # four trials share one GPU
    with pytest.raises(ConfigError, match=r"resources: gpu=1.5: above 1, GPUs per trial must be a whole number"):
        spec_lib.load(STUDIES / "quickstart.yaml", ["resources.gpu=1.5"])
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal is for machines without one")
    workspace = tmp_path / "ws"
    code = main(
        [
            "sweep",
            "run",
            str(STUDIES / "quickstart.yaml"),
            "--workspace",
            str(workspace),
            *[a for s in [*SMOKE, "resources.gpu=0.25"] for a in ("--set", s)],
        ]
    )
    assert_refused(
        code, capsys.readouterr().err, "resources.gpu=0.25 per trial, but no GPU is available", created=(workspace,)
    )


def test_a_sweep_asking_for_the_fused_head_without_gpus_is_refused_before_it_starts(tmp_path, capsys):
    """train.head=fused runs on CUDA only: a sweep whose trials get no GPU says so once, exit 2,
    rather than failing each trial on its worker."""
    workspace = tmp_path / "ws"
    code = main(
        [
            "sweep",
            "run",
            str(STUDIES / "quickstart.yaml"),
            "--workspace",
            str(workspace),
            *[a for s in [*SMOKE, "train.head=fused"] for a in ("--set", s)],
        ]
    )
    assert_refused(
        code,
        capsys.readouterr().err,
        "train.head=fused runs on CUDA only, and the trials get no GPU",
        created=(workspace,),
    )
    assert spec_lib.load(STUDIES / "quickstart.yaml", ["train.head=fused", "resources.gpu=0.25"]).resources.gpu == 0.25
