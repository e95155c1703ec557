"""Checks the decode attention kernel against torch's scaled_dot_product_attention.

Reads what `kernels_gpu_test --gtest_filter=*DumpForTorchComparison` wrote into KV_SDPA_DUMP
(query, gathered K/V, the kernel's output) and exits non-zero when the relative error exceeds
1e-2. Usage: KV_SDPA_DUMP=dir kernels_gpu_test ...; python3 sdpa_check.py dir
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F


def main(folder: str) -> int:
    meta = open(f"{folder}/meta.txt").read().split()
    seqs, hq, hkv, d = (int(x) for x in meta[:4])
    scale = float(meta[4])
    lens = [int(x) for x in meta[5:5 + seqs]]
    q = np.fromfile(f"{folder}/q.f32", dtype=np.float32).reshape(seqs, hq, d)
    out = np.fromfile(f"{folder}/out.f32", dtype=np.float32).reshape(seqs, hq, d)
    k_all = np.fromfile(f"{folder}/k.f32", dtype=np.float32)
    v_all = np.fromfile(f"{folder}/v.f32", dtype=np.float32)
    worst, at = 0.0, 0
    for s, n in enumerate(lens):
        k = torch.from_numpy(k_all[at:at + hkv * n * d].reshape(1, hkv, n, d)).cuda()
        v = torch.from_numpy(v_all[at:at + hkv * n * d].reshape(1, hkv, n, d)).cuda()
        at += hkv * n * d
        query = torch.from_numpy(q[s]).reshape(1, hq, 1, d).cuda()
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        ref = F.scaled_dot_product_attention(query.double(), k.double(), v.double(), scale=scale)
        got = torch.from_numpy(out[s]).cuda().double().reshape(1, hq, 1, d)
        err = ((got - ref).norm() / ref.norm()).item()
        worst = max(worst, err)
        print(f"sequence {s}: {n} tokens, relative error vs torch SDPA {err:.3e}")
    print(f"worst relative error {worst:.3e} (limit 1e-2)")
    return 0 if worst <= 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
