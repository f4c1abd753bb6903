"""`ftune train --cuda-fused LIST` (cli/cmd_train.c fused_mask, offload/session.c): an unknown
kernel name is a usage error (exit 2) naming the flag and the name; a valid list on a backend
other than CUDA is refused at open (exit 1) naming the flag and the device, with no adapter
written; `none` trains as without the flag. The fused kernels themselves: tests/emu,
tests/unit/test_bf16_ops.c, tests/gpu/test_cuda_fused.c (docs/gpu.md)."""
import subprocess

from cli_helpers import SEED_DATA, TINY, assert_clean_error, ftune_bin


def train(tmp_path, *extra):
    out = tmp_path / "out"
    cmd = [ftune_bin(), "train", "--model", str(TINY), "--data", str(SEED_DATA), "--max-steps", "1",
           "--seq-len", "64", "--save-every", "0", "--eval-fraction", "0", "--device", "cpu",
           "--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300), out


def test_unknown_kernel_is_a_usage_error(tmp_path):
    r, out = train(tmp_path, "--cuda-fused", "adamw,rope9")
    assert r.returncode == 2
    assert_clean_error(r, out, "--cuda-fused", "rope9")


def test_fused_kernels_need_cuda(tmp_path):
    r, out = train(tmp_path, "--cuda-fused", "adamw")
    assert r.returncode == 1
    assert_clean_error(r, out, "--cuda-fused", "device cpu")


def test_none_trains(tmp_path):
    r, out = train(tmp_path, "--cuda-fused", "none")
    assert r.returncode == 0, r.stderr
    assert (out / "adapter_model.safetensors").exists()
