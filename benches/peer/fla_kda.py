#!/usr/bin/env python3
"""This project's KDA ops against FLA (fla-org/flash-linear-attention, the `fla-core` wheel) on
identical inputs, on one GPU: FLA's `chunk_kda` against `kda_prefill` (H96 and H12 at 1x8192
and 8x1024 tokens) and FLA's `fused_recurrent_kda` against `kda_decode` (H12, batch 1, 64,
1024). Run by scripts/gpu-check.sh (step `fla_peer`); usable by hand:

  python3 benches/peer/fla_kda.py make --dir D          # inputs (numpy), case.json per case
  k3-peer --backend cuda --dir D                         # this project: outputs + event timings
  python3 benches/peer/fla_kda.py peer --dir D           # FLA: outputs + event timings
  python3 benches/peer/fla_kda.py compare --dir D [--json OUT]

`peer --impl torch [--device cpu]` runs this project's own PyTorch reference (k3peer.py) in
FLA's place: the harness and the argument mapping can then be checked without a GPU.

Mapping (FLA 0.6 API <- this project's params; see BENCHMARKS.md "FLA side by side"):
- layouts: FLA q/k/g [B,T,H,K], v [B,T,H,V], beta [B,T,H] = our [T,H,K] / [T,H] with B = 1
  and cu_seqlens (prefill), or B = batch, T = 1 (decode); state [N,H,K,V] K-major =
  KdaStateLayout::KMajor (FLA's state_v_first=False), f32 (FLA requires f32 initial state).
- gate: use_gate_in_kernel + safe_gate + lower_bound=-5 with A_log [H], dt_bias [H*K]:
  g = lb * sigmoid(exp(A_log) * (g_raw + dt_bias)) = KdaGateMode::LowerBound.
- beta: use_beta_sigmoid_in_kernel (logits) = beta_sigmoid; scale None = K^-1/2 = q_scale;
  use_qk_l2norm_in_kernel (x / sqrt(sum x^2 + 1e-6)) = use_qk_l2norm / qk_l2norm.
- decode: FLA's fused_recurrent_kda takes post-conv q, k, v; our kda_decode fuses the width-4
  conv + SiLU. The peer computes conv + SiLU in PyTorch (same f32 values our op uses) and
  times FLA alone (`us`) and conv + FLA (`chain_us`). Our op runs with output_norm None (FLA
  has no gated norm). Initial states are gathered from the pool by state_indices.
"""

import argparse
import json
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3peer  # noqa: E402
from k3peer import np  # noqa: E402  (numpy, with a clear message when missing)

PREFILL = [(96, 1, 8192), (96, 8, 1024), (12, 1, 8192), (12, 8, 1024)]
DECODE = [(12, 1), (12, 64), (12, 1024)]
SMOKE_PREFILL = [(2, 1, 64), (2, 2, 32)]
SMOKE_DECODE = [(2, 1), (2, 4)]


def make(a):
    rng = np.random.default_rng(a.seed)
    kd = 32 if a.smoke else 128
    os.makedirs(a.dir, exist_ok=True)
    for h, seqs, length in SMOKE_PREFILL if a.smoke else PREFILL:
        t = k3peer.kda_prefill_inputs(rng, seqs, length, h, kd, kd)
        k3peer.write_case(a.dir, f"kda_prefill_h{h}_{seqs}x{length}", "kda_prefill", {"lower_bound": -5.0, "chunk_size": 64}, f"H{h} {seqs}x{length}", t)
    for h, batch in SMOKE_DECODE if a.smoke else DECODE:
        t = k3peer.kda_decode_inputs(rng, batch, h, kd, kd, gated=False)
        k3peer.write_case(a.dir, f"kda_decode_h{h}_b{batch:04d}", "kda_decode", {"lower_bound": -5.0}, f"H{h} batch {batch}", t)
    print(f"wrote {len(k3peer.cases(a.dir))} cases to {a.dir}")


def load(torch, path, device):
    out = {}
    for name, (dtype, arr) in k3peer.read_safetensors(path).items():
        x = torch.from_numpy(np.ascontiguousarray(arr))
        out[name] = (x.to(torch.bfloat16) if dtype == "BF16" else x).to(device)
    return out


def decode_qkv(torch, t):
    """The conv + SiLU of our kda_decode in PyTorch: post-conv q, k, v [B, 1, H, K] (f32)."""
    idx = t["state_indices"].long()
    B, H, K = t["g_raw"].shape
    window = torch.cat([t["conv_state"].float()[idx], t["x_qkv"].float()[:, :, None]], dim=2)
    u = torch.nn.functional.silu((window * t["conv_weight"].float()[None]).sum(-1))
    V = (u.shape[1] - 2 * H * K) // H
    return u[:, :H * K].view(B, 1, H, K), u[:, H * K:2 * H * K].view(B, 1, H, K), u[:, 2 * H * K:].reshape(B, 1, H, V)


def runner(torch, impl, case, t, meta):
    """(run_main, run_chain) closures returning {name: tensor} outputs."""
    lb = meta["params"].get("lower_bound", -5.0)
    if case == "kda_prefill":
        H, K = t["q"].shape[1], t["q"].shape[2]
        if impl == "fla":
            from fla.ops.kda import chunk_kda

            def run():
                o, ht = chunk_kda(
                    t["q"][None], t["k"][None], t["v"][None], t["g_raw"][None], t["beta"][None],
                    scale=K ** -0.5, initial_state=t["state"], output_final_state=True,
                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                    safe_gate=True, lower_bound=lb, cu_seqlens=t["cu_seqlens"].long(),
                    A_log=t["a_log"][:H].contiguous(), dt_bias=t["dt_bias"])
                return {"out": o[0], "state": ht}
        else:
            def run():
                o, ht = k3peer.kda_prefill_torch(torch, t, lb, meta["params"].get("chunk_size", 64))
                return {"out": o, "state": ht}
        return run, None
    # kda_decode
    idx = t["state_indices"].long()
    h0 = t["state"][idx].contiguous()
    H = t["g_raw"].shape[1]
    if impl == "fla":
        from fla.ops.kda import fused_recurrent_kda
        q, k, v = decode_qkv(torch, t)

        def fla(q, k, v):
            o, ht = fused_recurrent_kda(
                q, k, v, t["g_raw"][:, None], t["beta"][:, None], A_log=t["a_log"][:H].contiguous(), dt_bias=t["dt_bias"],
                scale=None, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=lb)
            return {"out": o[:, 0], "state_rows": ht}

        return (lambda: fla(q, k, v)), (lambda: fla(*decode_qkv(torch, t)))

    def run():
        o, state, conv = k3peer.kda_decode_torch(torch, t, lb)
        return {"out": o, "state_rows": state[idx], "conv_state": conv}
    return run, None


def time_cuda(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    return ts


def peer(a):
    import torch
    device = a.device
    os.environ.setdefault("FLA_FLASH_KDA", "0")  # the Triton path, not the vendored FlashKDA
    torch.set_grad_enabled(False)
    for d in k3peer.cases(a.dir):
        meta = k3peer.read_json(os.path.join(d, "case.json"))
        name = os.path.basename(d)
        try:
            t = load(torch, os.path.join(d, "inputs.safetensors"), device)
            run, chain = runner(torch, a.impl, meta["op"], t, meta)
            outs = run()
            if device == "cuda":
                torch.cuda.synchronize()
                timer = lambda f: time_cuda(torch, f, a.warmup, a.iters)
            else:
                timer = lambda f: k3peer.time_us(f, a.warmup, a.iters)
            times = timer(run)
            report = {"op": meta["op"], "impl": a.impl, "device": device, "us": k3peer.median(times), "times_us": times}
            if chain is not None:
                report["chain_us"] = k3peer.median(timer(chain))
            k3peer.write_safetensors(os.path.join(d, "peer.safetensors"), {n: ("F32", x.float().cpu().numpy()) for n, x in outs.items()})
            print(f"{name}: {a.impl} {report['us']:.1f} us")
        except Exception as e:  # one failing case must not hide the others
            report = {"op": meta["op"], "impl": a.impl, "error": f"{type(e).__name__}: {e}"}
            print(f"{name}: {a.impl} FAILED: {report['error']}")
        with open(os.path.join(d, "peer.json"), "w") as f:
            json.dump(report, f, indent=1)


def compare(a):
    rows, failed = [], 0
    for d in k3peer.cases(a.dir):
        name = os.path.basename(d)
        meta = k3peer.read_json(os.path.join(d, "case.json"))
        row = {"case": name, "op": meta["op"], "shape": meta.get("shape", "")}
        try:
            ours_t, peer_t = k3peer.read_json(os.path.join(d, "k3.json")), k3peer.read_json(os.path.join(d, "peer.json"))
            for side, r in (("k3", ours_t), ("peer", peer_t)):
                if "error" in r:
                    raise RuntimeError(f"{side}: {r['error']}")
            ours = {n: arr for n, (_, arr) in k3peer.read_safetensors(os.path.join(d, "k3.safetensors")).items()}
            theirs = {n: arr for n, (_, arr) in k3peer.read_safetensors(os.path.join(d, "peer.safetensors")).items()}
            row.update({"k3_us": ours_t["us"], "peer_us": peer_t["us"], "peer_impl": peer_t["impl"], "ratio": ours_t["us"] / peer_t["us"]})
            if "chain_us" in peer_t:
                row["peer_chain_us"] = peer_t["chain_us"]
            row["out"] = k3peer.compare(ours["out"], theirs["out"])
            if "state_rows" in theirs:
                idx = k3peer.read_safetensors(os.path.join(d, "inputs.safetensors"))["state_indices"][1].astype(np.int64)
                row["state"] = k3peer.compare(ours["state"][idx], theirs["state_rows"])
            else:
                row["state"] = k3peer.compare(ours["state"], theirs["state"])
        except Exception as e:
            row["error"] = str(e)
            failed += 1
        rows.append(row)
    print(f"{'case':<26} {'ours us':>10} {'peer us':>10} {'ours/peer':>9} {'out max|d|':>11} {'out relRMSE':>11} {'state relRMSE':>13}  peer")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<26} FAILED: {r['error']}")
            continue
        chain = f" (conv+FLA {r['peer_chain_us']:.1f} us)" if "peer_chain_us" in r else ""
        print(f"{r['case']:<26} {r['k3_us']:>10.1f} {r['peer_us']:>10.1f} {r['ratio']:>9.2f} {r['out']['max_abs']:>11.3e} {r['out']['rel_rmse']:>11.3e} {r['state']['rel_rmse']:>13.3e}  {r['peer_impl']}{chain}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"schema": "k3-fla-peer/1", "rows": rows}, f, indent=1)
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--dir", required=True)
    m.add_argument("--smoke", action="store_true", help="tiny shapes (2 heads, K=V=32) for checks without a GPU")
    m.add_argument("--seed", type=int, default=7)
    r = sub.add_parser("peer")
    r.add_argument("--dir", required=True)
    r.add_argument("--impl", choices=["fla", "torch"], default="fla")
    r.add_argument("--device", default="cuda")
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--iters", type=int, default=20)
    c = sub.add_parser("compare")
    c.add_argument("--dir", required=True)
    c.add_argument("--json")
    a = p.parse_args()
    if a.cmd == "make":
        make(a)
    elif a.cmd == "peer":
        peer(a)
    else:
        sys.exit(compare(a))


if __name__ == "__main__":
    main()
