"""NF4 bytes against bitsandbytes (PyPI, its CPU path), byte for byte.

nf4_reference.py --checker NF4_CHECK --work DIR: writes weights of awkward
kinds (normal, heavy tails, all-zero blocks, values on the NF4 midpoints,
bf16 and fp16 inputs, a partial last block, an odd count), runs nf4_check on
them, and compares every output with bitsandbytes.functional's
quantize_4bit / dequantize_4bit (compress_statistics on and off).
"""
import argparse
import subprocess
import sys

import torch
import bitsandbytes.functional as F
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from safetensors.torch import load_file, save_file


def weights():
    g = torch.Generator().manual_seed(60)
    w = {
        "normal": torch.randn(256, 192, generator=g),
        "heavy_tails": torch.randn(128, 128, generator=g) ** 3,
        "bf16": torch.randn(64, 320, generator=g).bfloat16(),
        "fp16": torch.randn(96, 64, generator=g).half(),
        "partial_block": torch.randn(7, 45, generator=g),  # 315: 4 whole blocks and 59
        "odd": torch.randn(1, 99, generator=g),
        "large_nested": torch.randn(1024, 80, generator=g) * torch.linspace(0.01, 10, 80),  # 1280 absmax: 5 nested blocks
    }
    z = torch.randn(8, 64, generator=g)
    z[3] = 0
    w["zero_block"] = z
    # Values exactly on the midpoints between NF4 codes (ties), and at +-absmax.
    code = F.get_4bit_type("nf4", device="cpu")
    mid = (code[:-1] + code[1:]) / 2
    t = torch.cat([mid, -mid, torch.tensor([1.0, -1.0]), code]).repeat(4)[:128].reshape(2, 64)
    t[:, 0] = 1.0
    w["midpoints"] = t
    return w


def dequantize(packed, absmax, w, dtype):
    """dequantize_4bit on the CPU. Where a weight's rows are not whole blocks
    (its last dimension not a multiple of 64), bitsandbytes 0.50.2's AVX-512
    kernel reads each row's scales as if blocks restarted at every row, and
    its result is wrong (2.5 off on randn(1024, 80), against 0.52 for the
    right dequantization): there its own portable kernel is the reference."""
    if w.shape[-1] % 64 == 0 or w.shape[-1] % 2 == 1:
        return torch.ops.bitsandbytes.dequantize_4bit.default(packed, absmax, 64, "nf4", w.shape, dtype).reshape(-1)
    code = F.get_4bit_type("nf4", device="cpu")
    return _dequantize_4bit_compute(packed.reshape(-1), absmax, code, 64, w.shape, dtype).reshape(-1)


def bnb(w):
    out = {}
    q, s = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    out["packed"] = q.reshape(-1)
    out["absmax"] = s.absmax
    out["float32"] = dequantize(q, s.absmax, w, torch.float32)
    out["bfloat16"] = dequantize(q, s.absmax, w, torch.bfloat16)
    q2, s2 = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    assert torch.equal(q2, q), "compress_statistics changed the packed codes"
    out["nested_codes"] = s2.absmax
    out["nested_absmax"] = s2.state2.absmax
    out["offset"] = s2.offset.reshape(1)
    out["expanded"] = F.dequantize_blockwise(s2.absmax, s2.state2) + s2.offset
    out["nested_bfloat16"] = dequantize(q2, out["expanded"], w, torch.bfloat16)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checker", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    w = weights()
    save_file({k: v.contiguous() for k, v in w.items()}, f"{args.work}/weights.safetensors")
    subprocess.run([args.checker, f"{args.work}/weights.safetensors", f"{args.work}/ours.safetensors"], check=True)
    ours = load_file(f"{args.work}/ours.safetensors")
    failures = 0
    for name, tensor in w.items():
        ref = bnb(tensor)
        for part, expected in ref.items():
            got = ours[f"{name}.{part}"]
            same = got.dtype == expected.dtype and torch.equal(got.reshape(-1), expected.reshape(-1).to(got.device))
            if not same:
                failures += 1
                diff = (got.reshape(-1).float() != expected.reshape(-1).float()).sum().item() if got.numel() == expected.numel() else "size"
                print(f"FAIL {name}.{part}: {got.dtype} {tuple(got.shape)} vs bitsandbytes {expected.dtype} "
                      f"{tuple(expected.shape)}; {diff} elements differ")
    parts = len(w) * 9
    print(f"nf4 bytes: {parts - failures} of {parts} outputs equal bitsandbytes {__import__('bitsandbytes').__version__}'s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
