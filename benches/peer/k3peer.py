"""Shared parts of the side-by-side scripts (cpu_vs_torch.py, fla_kda.py): case directories in
the format `k3-peer` reads (benches/src/peer.rs), a dependency-free safetensors reader/writer
(numpy only), input generators, PyTorch reference implementations of the ops written from this
project's contracts (kernel-api/src/ops/*.rs), and the comparison metrics.

A case directory holds case.json ({"op", "params", "shape"}), inputs.safetensors, and after the
runs k3.safetensors + k3.json (k3-peer) and peer.safetensors + peer.json (the peer).
"""

import json
import os
import struct
import subprocess
import time

try:
    import numpy as np
except ImportError:
    raise SystemExit("numpy is needed for the side-by-side scripts (pip install numpy)")

# ---- safetensors (format: u64 header length, JSON header, raw little-endian bytes) ----------

_NP = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BF16": np.uint16}


def bf16_bits(x):
    """float32 array -> bf16 bit patterns (round to nearest even), as uint16."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = b + 0x7FFF + ((b >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def bf16_value(bits):
    """bf16 bit patterns -> float32 values."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, array)}; BF16 arrays hold float32 values, rounded here."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, a = tensors[name]
        a = bf16_bits(a) if dtype == "BF16" else np.ascontiguousarray(a, dtype=_NP[dtype])
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


def read_safetensors(path):
    """{name: (dtype, array)}; BF16 comes back as float32 values."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype, (a, b) = meta["dtype"], meta["data_offsets"]
        if dtype not in _NP:
            raise ValueError(f"{path}: tensor {name}: dtype {dtype} not handled here")
        arr = np.frombuffer(data, dtype=_NP[dtype], count=(b - a) // np.dtype(_NP[dtype]).itemsize, offset=8 + n + a)
        arr = arr.reshape(meta["shape"])
        out[name] = (dtype, bf16_value(arr) if dtype == "BF16" else arr.copy())
    return out


# ---- cases --------------------------------------------------------------------------------------

def write_case(root, name, op, params, shape, tensors):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    for stale in ("k3.safetensors", "k3.json", "peer.safetensors", "peer.json"):
        if os.path.exists(os.path.join(d, stale)):
            os.remove(os.path.join(d, stale))
    write_safetensors(os.path.join(d, "inputs.safetensors"), tensors)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump({"op": op, "params": params, "shape": shape}, f, indent=1)
    return d


def cases(root):
    return sorted(d for d in (os.path.join(root, n) for n in os.listdir(root)) if os.path.isfile(os.path.join(d, "case.json")))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def k3_peer(binary, backend, root, warmup, iters, timeout=None):
    """Runs `k3-peer`; returns its exit code (its stdout/stderr pass through)."""
    cmd = [binary, "--backend", backend, "--dir", root, "--warmup", str(warmup), "--iters", str(iters)]
    return subprocess.run(cmd, timeout=timeout).returncode


def find_k3_peer(explicit=None):
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    for prof in ("release", "debug"):
        p = os.path.join(here, "..", "..", "target", prof, "k3-peer")
        if os.access(p, os.X_OK):
            return os.path.normpath(p)
    raise SystemExit("k3-peer not found: build it with `cargo build --release -p k3-benches --bin k3-peer` or pass --k3-peer PATH")


# ---- inputs ---------------------------------------------------------------------------------

def kda_prefill_inputs(rng, seqs, length, heads, k, v):
    t = seqs * length
    n = lambda *s, std=1.0: (rng.standard_normal(s, dtype=np.float32) * std)
    return {
        "q": ("BF16", n(t, heads, k)), "k": ("BF16", n(t, heads, k)), "v": ("BF16", n(t, heads, v)),
        "g_raw": ("BF16", n(t, heads, k)), "beta": ("BF16", n(t, heads)),
        "a_log": ("F32", n(heads, std=0.5)), "dt_bias": ("F32", n(heads * k, std=0.5)),
        "cu_seqlens": ("I64", np.arange(seqs + 1, dtype=np.int64) * length),
        "state": ("F32", n(seqs, heads, k, v, std=0.05)),
    }


def kda_decode_inputs(rng, batch, heads, k, v, width=4, gated=True):
    d, slots = heads * (2 * k + v), batch + 1
    n = lambda *s, std=1.0: (rng.standard_normal(s, dtype=np.float32) * std)
    t = {
        "x_qkv": ("BF16", n(batch, d)), "conv_weight": ("F32", n(d, width, std=0.5)),
        "conv_state": ("F32", n(slots, d, width - 1)), "g_raw": ("BF16", n(batch, heads, k)),
        "beta": ("BF16", n(batch, heads)), "a_log": ("F32", n(heads, std=0.5)),
        "dt_bias": ("F32", n(heads * k, std=0.5)),
        # Slot 0 is the null slot: rows use 1..batch in a random order.
        "state_indices": ("I32", rng.permutation(batch).astype(np.int32) + 1),
        "state": ("F32", n(slots, heads, k, v, std=0.05)),
    }
    if gated:
        t["output_gate"] = ("BF16", n(batch, heads, v))
        t["norm_weight"] = ("F32", 1.0 + n(v, std=0.05))
    return t


def mla_decode_inputs(rng, batch, ctx, heads, page=64, width=576):
    per_seq = -(-ctx // page)
    pages = batch * per_seq
    return {
        "q": ("BF16", rng.standard_normal((batch, 1, heads, width), dtype=np.float32)),
        "kv_cache": ("BF16", rng.standard_normal((pages, page, width), dtype=np.float32)),
        "block_table": ("I32", rng.permutation(pages).astype(np.int32).reshape(batch, per_seq)),
        "seq_lens": ("I32", np.full(batch, ctx, dtype=np.int32)),
    }


def moe_inputs(rng, tokens, d, n, experts):
    return {
        "x": ("BF16", rng.standard_normal((tokens, d), dtype=np.float32)),
        "router_weight": ("BF16", rng.standard_normal((experts, d), dtype=np.float32) * 0.03),
        "bias": ("F32", rng.standard_normal(experts, dtype=np.float32) * 0.05),
        "w13": ("U8", rng.integers(0, 256, (experts, 2 * n, d // 2), dtype=np.uint8)),
        "s13": ("U8", rng.integers(121, 123, (experts, 2 * n, d // 32), dtype=np.uint8)),
        "w2": ("U8", rng.integers(0, 256, (experts, d, n // 2), dtype=np.uint8)),
        "s2": ("U8", rng.integers(121, 123, (experts, d, n // 32), dtype=np.uint8)),
    }


def gemm_inputs(rng, m, n, k):
    return {
        "x": ("BF16", rng.standard_normal((m, k), dtype=np.float32)),
        "w": ("BF16", rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)),
    }


# ---- metrics --------------------------------------------------------------------------------

def compare(ours, peer):
    """max |a-b| and rmse(a-b)/rms(b) (the project's tolerance metric), in f64."""
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(peer, dtype=np.float64)
    if a.shape != b.shape:
        return {"error": f"shape {a.shape} vs {b.shape}"}
    diff = a - b
    rms = float(np.sqrt(np.mean(b * b))) if b.size else 0.0
    return {"max_abs": float(np.max(np.abs(diff))) if diff.size else 0.0,
            "rel_rmse": float(np.sqrt(np.mean(diff * diff))) / rms if rms > 0 else float(np.sqrt(np.mean(diff * diff)))}


def median(xs):
    s = sorted(xs)
    return s[len(s) // 2]


def time_us(fn, warmup, iters, sync=None):
    """Median wall time of fn() in µs (sync() after each call when given)."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        ts.append((time.perf_counter() - t0) * 1e6)
    return ts


# ---- PyTorch references, written from this project's op contracts -------------------------

def situ(torch, g, u, beta=4.0, linear_beta=25.0):
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (linear_beta * torch.tanh(u / linear_beta))


def kda_gate(torch, g_raw, a_log, dt_bias, lower_bound):
    """g = lb·σ(exp(A_log[h])·(g_raw + dt_bias)) in f32; g_raw [..., H, K]."""
    h, k = g_raw.shape[-2], g_raw.shape[-1]
    z = torch.exp(a_log[:h]).view(h, 1) * (g_raw.float() + dt_bias.view(h, k))
    return lower_bound * torch.sigmoid(z)


def l2n(torch, x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def kda_chunk(torch, q, k, v, g, beta, state, chunk=64):
    """One sequence, all heads: q, k, g [L, H, K], v [L, H, V] (q already normalised and
    scaled, k normalised), g log-decays, beta [L, H], state [H, K, V]; the chunked WY form of
    k3-architecture.md 2.3 in f32. Returns o [L, H, V], the final state."""
    L, H, K = q.shape
    S = state.clone()
    outs = []
    for c0 in range(0, L, chunk):
        qc, kc, vc = q[c0:c0 + chunk].transpose(0, 1), k[c0:c0 + chunk].transpose(0, 1), v[c0:c0 + chunk].transpose(0, 1)
        gc, bc = g[c0:c0 + chunk].transpose(0, 1), beta[c0:c0 + chunk].transpose(0, 1)
        c = qc.shape[1]
        G = torch.cumsum(gc, dim=1)                                    # [H, c, K]
        diff = G[:, :, None, :] - G[:, None, :, :]                     # G_i - G_j, [H, c, c, K]
        lower = torch.tril(torch.ones(c, c, dtype=torch.bool), -1)
        upto = torch.tril(torch.ones(c, c, dtype=torch.bool), 0)
        decay = torch.exp(torch.where(upto[None, :, :, None], diff, torch.full_like(diff, -float("inf"))))
        Lm = bc[:, :, None] * torch.einsum("hik,hjk,hijk->hij", kc, kc, decay) * lower
        eye = torch.eye(c, dtype=q.dtype).expand(H, c, c)
        T = torch.linalg.solve_triangular(eye + Lm, torch.diag_embed(bc), upper=False)
        eG = torch.exp(G)
        w = T @ (eG * kc)
        u = T @ vc
        vn = u - w @ S
        Aqk = torch.einsum("hik,hjk,hijk->hij", qc, kc, decay)
        outs.append(((qc * eG) @ S + Aqk @ vn).transpose(0, 1))
        last = G[:, -1:, :]                                            # [H, 1, K]
        S = torch.exp(last).transpose(1, 2) * S + (torch.exp(last - G) * kc).transpose(1, 2) @ vn
    return torch.cat(outs, 0), S


def kda_prefill_torch(torch, t, lower_bound=-5.0, chunk=64):
    """Inputs as kda_prefill_inputs (torch tensors); returns out (f32) and the final states."""
    cu = t["cu_seqlens"].tolist()
    H, K = t["q"].shape[1], t["q"].shape[2]
    q = l2n(torch, t["q"].float()) * K ** -0.5
    k = l2n(torch, t["k"].float())
    g = kda_gate(torch, t["g_raw"], t["a_log"], t["dt_bias"], lower_bound)
    beta = torch.sigmoid(t["beta"].float())
    outs, states = [], []
    for n in range(len(cu) - 1):
        a, b = cu[n], cu[n + 1]
        o, s = kda_chunk(torch, q[a:b], k[a:b], t["v"][a:b].float(), g[a:b], beta[a:b], t["state"][n].float(), chunk)
        outs.append(o)
        states.append(s)
    return torch.cat(outs, 0), torch.stack(states)


def kda_decode_torch(torch, t, lower_bound=-5.0, eps=1e-5):
    """Inputs as kda_decode_inputs; returns out, new state pool, new conv-state pool (f32)."""
    idx = t["state_indices"].long()
    B, H, K = t["g_raw"].shape
    state, conv = t["state"].float().clone(), t["conv_state"].float().clone()
    V = state.shape[-1]
    window = torch.cat([conv[idx], t["x_qkv"].float()[:, :, None]], dim=2)      # [B, D, W]
    u = torch.nn.functional.silu((window * t["conv_weight"].float()[None]).sum(-1))
    conv[idx] = window[:, :, 1:]
    q = l2n(torch, u[:, :H * K].view(B, H, K)) * K ** -0.5
    k = l2n(torch, u[:, H * K:2 * H * K].view(B, H, K))
    v = u[:, 2 * H * K:].view(B, H, V)
    alpha = torch.exp(kda_gate(torch, t["g_raw"], t["a_log"], t["dt_bias"], lower_bound))   # [B, H, K]
    beta = torch.sigmoid(t["beta"].float())
    S = state[idx] * alpha[..., None]                                          # [B, H, K, V]
    r = v - torch.einsum("bhkv,bhk->bhv", S, k)
    S = S + beta[..., None, None] * k[..., None] * r[..., None, :]
    o = torch.einsum("bhkv,bhk->bhv", S, q)
    state[idx] = S
    if "output_gate" in t:
        o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + eps) * t["norm_weight"].float() * torch.sigmoid(t["output_gate"].float())
    return o, state, conv


def mla_decode_torch(torch, t, scale=1.0 / 192 ** 0.5, latent=512):
    """q [B, 1, H, 576], bf16 paged cache; returns out [B, 1, H, 512] and lse (f32)."""
    kv, bt, lens, q = t["kv_cache"], t["block_table"].long(), t["seq_lens"].tolist(), t["q"]
    outs, lses = [], []
    for b in range(q.shape[0]):
        keys = kv[bt[b]].reshape(-1, kv.shape[-1])[:lens[b]]               # [L, 576]
        s = (q[b, 0].float() @ keys.float().T) * scale                      # [H, L]
        lses.append(torch.logsumexp(s, -1))
        outs.append(torch.softmax(s, -1) @ keys[:, :latent].float())
    return torch.stack(outs)[:, None], torch.stack(lses)[:, None]


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def mxfp4_dequant(codes, scales):
    """[..., K/2] codes (low nibble = even column) and [..., K/32] E8M0 scales -> [..., K] f32."""
    lo, hi = E2M1[codes & 15], E2M1[codes >> 4]
    vals = np.stack([lo, hi], -1).reshape(*codes.shape[:-1], codes.shape[-1] * 2)
    s = np.exp2(scales.astype(np.float32) - 127.0)
    return vals * np.repeat(s, 32, axis=-1)


def moe_torch(torch, t, w13, w2, top_k, beta=4.0, linear_beta=25.0):
    """Router (f32 sigmoid, bias selects, renormalised) -> SiTU experts -> weighted sum.
    w13 [E, 2N, D], w2 [E, D, N] dequantised bf16. Returns out (f32), ids, weights."""
    x = t["x"]
    s = torch.sigmoid(x.float() @ t["router_weight"].float().T)
    ids = torch.topk(s + t["bias"].float(), top_k, dim=-1).indices
    w = torch.gather(s, 1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20)
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32)
    n = w13.shape[1] // 2
    for e in torch.unique(ids).tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)
        h = (x[rows] @ w13[e].T).float()
        a = situ(torch, h[:, :n], h[:, n:], beta, linear_beta).to(x.dtype)
        out.index_add_(0, rows, (a @ w2[e].T).float() * w[rows, slot][:, None])
    return out, ids, w
