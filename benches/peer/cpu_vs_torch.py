#!/usr/bin/env python3
"""This project's CPU backend against PyTorch eager on the CPU, same inputs, one run: KDA
prefill, KDA decode, MLA decode, the routed MoE expert block and a dense GEMM at mid shapes.
Prints the time of each side, the ratio and how far the outputs are apart.

  cargo build --release -p k3-benches --bin k3-peer
  python3 benches/peer/cpu_vs_torch.py [--dir DIR] [--iters N] [--json OUT]

The inputs are made with numpy and written as safetensors; `k3-peer --backend cpu` runs the
ops (kernel-api's CPU reference backend, rayon threads = RAYON_NUM_THREADS or all cores) and
PyTorch runs its eager equivalents (benches/peer/k3peer.py, written from the op contracts)
with the same thread count. Without PyTorch the script says so and only times this project's
side. Both sides are timed around the op alone (inputs already in memory): median of --iters
runs after --warmup.
"""

import argparse
import json
import os
import sys
import tempfile


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3peer  # noqa: E402
from k3peer import np  # noqa: E402  (numpy, with a clear message when missing)

# (name, op, params, shape text, input maker)
CASES = [
    ("kda_prefill", "kda_prefill", {"lower_bound": -5.0, "chunk_size": 64}, "2 seqs x 256 tokens, H4, K=V=128",
     lambda rng: k3peer.kda_prefill_inputs(rng, 2, 256, 4, 128, 128)),
    ("kda_decode", "kda_decode", {"lower_bound": -5.0}, "batch 16, H12, K=V=128, gated norm",
     lambda rng: k3peer.kda_decode_inputs(rng, 16, 12, 128, 128, gated=True)),
    ("mla_decode", "mla_decode", {}, "batch 4, ctx 2048, H12, bf16 cache, page 64",
     lambda rng: k3peer.mla_decode_inputs(rng, 4, 2048, 12)),
    ("moe", "moe", {"top_k": 4}, "16 tokens, D 512, N 256, 32 MXFP4 experts, top-4",
     lambda rng: k3peer.moe_inputs(rng, 16, 512, 256, 32)),
    ("gemm", "gemm", {}, "M 64, N 1024, K 1024, bf16",
     lambda rng: k3peer.gemm_inputs(rng, 64, 1024, 1024)),
]


def torch_side(torch, op, params, t):
    """(fn, outputs-of-one-run) for the PyTorch eager version of a case."""
    if op == "kda_prefill":
        f = lambda: k3peer.kda_prefill_torch(torch, t, params["lower_bound"], params["chunk_size"])
        o, s = f()
        return f, {"out": o, "state": s}
    if op == "kda_decode":
        f = lambda: k3peer.kda_decode_torch(torch, t, params["lower_bound"])
        o, s, c = f()
        return f, {"out": o, "state": s, "conv_state": c}
    if op == "mla_decode":
        f = lambda: k3peer.mla_decode_torch(torch, t)
        o, lse = f()
        return f, {"out": o, "lse": lse}
    if op == "moe":
        w13 = torch.from_numpy(k3peer.mxfp4_dequant(t["w13"].numpy(), t["s13"].numpy())).to(torch.bfloat16)
        w2 = torch.from_numpy(k3peer.mxfp4_dequant(t["w2"].numpy(), t["s2"].numpy())).to(torch.bfloat16)
        f = lambda: k3peer.moe_torch(torch, t, w13, w2, params["top_k"])
        o, ids, w = f()
        return f, {"out": o}
    f = lambda: t["x"] @ t["w"].T
    return f, {"out": f()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="case directory (default: a temporary one)")
    p.add_argument("--k3-peer", help="path of the k3-peer binary (default: target/release or target/debug)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed: skipping the PyTorch side (pip install torch to compare)")
    binary = k3peer.find_k3_peer(a.k3_peer)
    root = a.dir or tempfile.mkdtemp(prefix="k3-cpu-vs-torch-")
    rng = np.random.default_rng(a.seed)
    for name, op, params, shape, make in CASES:
        k3peer.write_case(root, name, op, params, shape, make(rng))
    rc = k3peer.k3_peer(binary, "cpu", root, a.warmup, a.iters)
    threads = int(os.environ.get("RAYON_NUM_THREADS", os.cpu_count() or 1))
    if torch is not None:
        torch.set_num_threads(threads)
        torch.set_grad_enabled(False)
    rows = []
    for name, op, params, shape, _ in CASES:
        d = os.path.join(root, name)
        ours = k3peer.read_json(os.path.join(d, "k3.json"))
        row = {"op": name, "shape": shape, "k3_us": ours.get("us"), "k3_error": ours.get("error")}
        if torch is not None and "error" not in ours:
            t = {}
            for n, (dtype, arr) in k3peer.read_safetensors(os.path.join(d, "inputs.safetensors")).items():
                x = torch.from_numpy(np.ascontiguousarray(arr))
                t[n] = x.to(torch.bfloat16) if dtype == "BF16" else x
            fn, outs = torch_side(torch, op, params, t)
            row["torch_us"] = k3peer.median(k3peer.time_us(fn, a.warmup, a.iters))
            row["ratio"] = row["k3_us"] / row["torch_us"]
            mine = {n: arr for n, (_, arr) in k3peer.read_safetensors(os.path.join(d, "k3.safetensors")).items()}
            row["diff"] = {n: k3peer.compare(mine[n], x.float().numpy()) for n, x in outs.items() if n in mine}
        rows.append(row)
    print(f"\nCPU side by side ({threads} threads each; median of {a.iters} after {a.warmup} warmup)")
    print(f"{'op':<12} {'k3 cpu us':>12} {'torch us':>12} {'k3/torch':>9}  {'out max|d|':>10} {'out relRMSE':>11}  shape")
    for r in rows:
        if r.get("k3_error"):
            print(f"{r['op']:<12} FAILED: {r['k3_error']}")
            continue
        if "torch_us" not in r:
            print(f"{r['op']:<12} {r['k3_us']:>12.1f} {'-':>12} {'-':>9}  {'-':>10} {'-':>11}  {r['shape']}")
            continue
        o = r["diff"]["out"]
        print(f"{r['op']:<12} {r['k3_us']:>12.1f} {r['torch_us']:>12.1f} {r['ratio']:>9.2f}  {o['max_abs']:>10.2e} {o['rel_rmse']:>11.2e}  {r['shape']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"schema": "k3-cpu-vs-torch/1", "threads": threads, "torch": getattr(torch, "__version__", None), "rows": rows}, f, indent=1)
    sys.exit(rc)


if __name__ == "__main__":
    main()
