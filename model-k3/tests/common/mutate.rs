//! Generators of malformed inputs: JSON values that are wrong for any key, mutations of a `k3 op`
//! request (params and tensors), of a config and of a safetensors file. Seeded, so a failing
//! case is reproduced by its seed.

use super::requests::Request;
use kernel_api::conformance::TestRng;
use kernel_api::{DType, HostTensor};
use serde_json::{json, Map, Value};

/// Values that are wrong somewhere: out of every range, of the wrong type, or empty.
pub fn bad_value(r: &mut TestRng) -> Value {
    let pool = [
        json!(-1),
        json!(0),
        json!(1),
        json!(2),
        json!(3),
        json!(17),
        json!(i32::MAX),
        json!(1u64 << 31),
        json!(1u64 << 32),
        json!(1u64 << 40),
        json!(1u64 << 53),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(0.5),
        json!(-0.0),
        json!(1e-40),
        json!(3.5e38),
        json!(1e300),
        json!(-1e300),
        json!("x"),
        json!(""),
        json!("auto"),
        json!(true),
        Value::Null,
        json!([]),
        json!([1, -1]),
        json!([[0, 1], [2]]),
        json!([[[[[[[[1]]]]]]]]),
        json!({}),
        json!({"num_splits": 0}),
        json!({"lower_bound": 1.0}),
        json!({"gate_up": {"beta": -1}}),
    ];
    pool[r.below(pool.len())].clone()
}

/// Keys some op reads: moved to another op, or nested where they do not belong, they must be
/// rejected by name.
const KEYS: &[&str] = &[
    "eps", "m", "n", "k", "d", "heads", "q_len", "tokens", "top_k", "experts", "block_m", "splits", "variant", "cache", "dims",
    "latent", "rope", "format", "kv_scale", "page_size", "num_pages", "softmax_scale", "causal", "gate", "mode", "stage", "routing",
    "beta", "linear_beta", "chunk_size", "state_layout", "state_slots", "out_dtypes", "dtypes", "bogus", "",
];

/// Host metadata keys: an array here overrides the host copy of the same-named tensor.
const METADATA: &[&str] = &["cu_seqlens", "cu_seqlens_k", "cu_seqlens_q", "seq_lens", "block_table", "slot_mapping", "state_indices", "checkpoint_offsets", "ids"];

/// Every path to a value of `v` (objects included), as key lists.
fn paths(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Value::Object(m) = v {
        for (k, child) in m {
            prefix.push(k.clone());
            out.push(prefix.clone());
            paths(child, prefix, out);
            prefix.pop();
        }
    }
}

fn parent_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Map<String, Value>> {
    let mut cur = v;
    for k in &path[..path.len() - 1] {
        cur = cur.get_mut(k)?;
    }
    cur.as_object_mut()
}

fn random_ints(r: &mut TestRng, n: usize) -> Vec<i64> {
    let pool = [-1i64, 0, 1, 2, 3, 5, 7, 100, 100_000, i32::MAX as i64, i32::MIN as i64, i64::MAX, -100_000];
    (0..n).map(|_| if r.below(3) == 0 { pool[r.below(pool.len())] } else { r.below(8) as i64 }).collect()
}

/// A tensor of `dtype` and `shape` with random bytes (floats) or small integers; integer tensors
/// are zero-filled when `int_values` is false (values of device metadata are the other suite's).
fn tensor(r: &mut TestRng, dtype: DType, shape: &[usize], int_values: bool) -> HostTensor {
    let z = HostTensor::zeros(dtype, shape);
    match dtype {
        DType::I32 if int_values => {
            let v: Vec<i32> = random_ints(r, z.bytes.len() / 4).into_iter().map(|x| x as i32).collect();
            HostTensor::from_i32(shape, &v).unwrap_or(z)
        }
        DType::I64 if int_values => HostTensor::from_i64(shape, &random_ints(r, z.bytes.len() / 8)).unwrap_or(z),
        DType::I32 | DType::I64 => z,
        _ => {
            let bytes = (0..z.bytes.len()).map(|_| r.below(256) as u8).collect();
            HostTensor::from_bytes(dtype, shape, bytes).unwrap_or(z)
        }
    }
}

/// Elements a mutated tensor may have (the generators test descriptors, not memory).
const MAX_ELEMS: usize = 1 << 14;

/// Applies 1 to 3 random mutations to a valid request. `host_metadata`: whether values of
/// integer tensors and host-metadata overrides may be mutated (device metadata that differs from
/// what the plan saw is the kernels' own bad-input suite; the CPU backend re-checks it).
pub fn mutate(r: &mut TestRng, base: &Request, host_metadata: bool) -> (std::collections::BTreeMap<String, HostTensor>, Value) {
    let mut inputs = base.inputs.clone();
    let mut params = base.params.clone();
    for _ in 0..1 + r.below(3) {
        let names: Vec<String> = inputs.keys().cloned().collect();
        match r.below(12) {
            // Params: a value replaced, a key removed, a key added, the whole file replaced.
            0..=2 => {
                let mut ps = Vec::new();
                paths(&params, &mut Vec::new(), &mut ps);
                if let Some(p) = (!ps.is_empty()).then(|| ps[r.below(ps.len())].clone()) {
                    let v = bad_value(r);
                    if let Some(m) = parent_mut(&mut params, &p) {
                        m.insert(p[p.len() - 1].clone(), v);
                    }
                }
            }
            3 => {
                let mut ps = Vec::new();
                paths(&params, &mut Vec::new(), &mut ps);
                if let Some(p) = (!ps.is_empty()).then(|| ps[r.below(ps.len())].clone()) {
                    if let Some(m) = parent_mut(&mut params, &p) {
                        m.remove(&p[p.len() - 1]);
                    }
                }
            }
            4 => {
                let key = KEYS[r.below(KEYS.len())];
                let v = bad_value(r);
                if let Some(m) = params.as_object_mut() {
                    m.insert(key.to_string(), v);
                }
            }
            5 if r.below(8) == 0 => params = bad_value(r),
            5 => {
                let name = if names.is_empty() || r.below(4) == 0 { "bogus".to_string() } else { names[r.below(names.len())].clone() };
                let key = if r.below(2) == 0 { "dtypes" } else { "out_dtypes" };
                let names = ["f32", "bf16", "f16", "u8", "i32", "i64", "f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "e8m0", "f4e2m1x2", "f64", ""];
                let dt = names[r.below(names.len())];
                if let Some(m) = params.as_object_mut() {
                    m.insert(key.to_string(), json!({ name: dt }));
                }
            }
            // Host metadata arrays that differ from the tensors (re-checked by the CPU backend).
            6 if host_metadata => {
                let key = METADATA[r.below(METADATA.len())];
                let n = r.below(7);
                let len = n * if r.below(3) == 0 { 2 } else { 1 };
                let v = random_ints(r, len);
                let v = if v.len() > n && n > 0 { json!(v.chunks(2).map(|c| c.to_vec()).collect::<Vec<_>>()) } else { json!(v) };
                if let Some(m) = params.as_object_mut() {
                    m.insert(key.to_string(), v);
                }
            }
            // Tensors: removed, another dtype, another shape or rank, an unknown or output name.
            7 if !names.is_empty() => {
                inputs.remove(&names[r.below(names.len())]);
            }
            8 if !names.is_empty() => {
                let name = &names[r.below(names.len())];
                let shape = inputs[name].shape.clone();
                let dt = DType::ALL[r.below(DType::ALL.len())];
                inputs.insert(name.clone(), tensor(r, dt, &shape, host_metadata));
            }
            9..=10 if !names.is_empty() => {
                let name = &names[r.below(names.len())];
                let old = &inputs[name];
                let mut shape = old.shape.clone();
                match r.below(4) {
                    0 if !shape.is_empty() => {
                        let i = r.below(shape.len());
                        let d = shape[i];
                        shape[i] = [0, 1, d.saturating_sub(1), d + 1, 2 * d, d + 7][r.below(6)];
                    }
                    1 => shape.insert(r.below(shape.len() + 1), 1),
                    2 if !shape.is_empty() => {
                        shape.remove(r.below(shape.len()));
                    }
                    _ => shape = vec![shape.iter().product()],
                }
                if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_some_and(|n| n <= MAX_ELEMS) {
                    let dt = old.dtype;
                    inputs.insert(name.clone(), tensor(r, dt, &shape, host_metadata));
                }
            }
            _ => {
                let name = ["bogus", "out", "lse", "workspace", "x", "q", "state"][r.below(7)];
                let dt = DType::ALL[r.below(DType::ALL.len())];
                let rows = 1 + r.below(4);
                inputs.insert(name.to_string(), tensor(r, dt, &[rows, 2], host_metadata));
            }
        }
    }
    (inputs, params)
}

/// A mutation of the tiny config's `text_config` (or of the root): one to three keys replaced
/// by bad values, removed, or nested lists broken.
pub fn mutate_config(r: &mut TestRng, root: &Value) -> Value {
    let mut v = root.clone();
    for _ in 0..1 + r.below(3) {
        let mut ps = Vec::new();
        paths(&v, &mut Vec::new(), &mut ps);
        let p = ps[r.below(ps.len())].clone();
        match r.below(6) {
            0 => {
                if let Some(m) = parent_mut(&mut v, &p) {
                    m.remove(&p[p.len() - 1]);
                }
            }
            1 if p.last().is_some_and(|k| k.ends_with("layers")) => {
                let n = r.below(8);
                let list: Vec<i64> = (0..n).map(|_| [-1i64, 0, 1, 2, 3, 4, 5, 6, 100, i64::MAX][r.below(10)]).collect();
                if let Some(m) = parent_mut(&mut v, &p) {
                    m.insert(p[p.len() - 1].clone(), json!(list));
                }
            }
            _ => {
                let b = bad_value(r);
                if let Some(m) = parent_mut(&mut v, &p) {
                    m.insert(p[p.len() - 1].clone(), b);
                }
            }
        }
    }
    v
}

/// A mutation of a whole safetensors file: the length field, bytes of the header text, a
/// header entry's dtype, shape or offsets, the file cut short or padded.
pub fn mutate_safetensors(r: &mut TestRng, file: &[u8]) -> Vec<u8> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let mut out = file.to_vec();
    match r.below(7) {
        0 => {
            let v = [0u64, 1, 7, n as u64 - 1, n as u64 + 1, file.len() as u64, u64::MAX, 100_000_001][r.below(8)];
            out[..8].copy_from_slice(&v.to_le_bytes());
        }
        1 => {
            for _ in 0..1 + r.below(4) {
                let i = 8 + r.below(n);
                out[i] = [b'{', b'}', b'"', b',', b'[', b']', b'0', b'9', b'-', 0xFF, b' '][r.below(11)];
            }
        }
        2 | 3 => {
            let header: Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
            let mut header = header;
            let names: Vec<String> = header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect();
            let name = &names[r.below(names.len())];
            let e = &mut header[name];
            match r.below(4) {
                0 => {
                    let d = ["F64", "BOOL", "F4", "I8", "U64", "XYZ", "F8_E8M0", "C64"][r.below(8)];
                    e["dtype"] = json!(d);
                }
                1 => {
                    let shape = e["shape"].as_array().cloned().unwrap_or_default();
                    let mut s: Vec<Value> = shape;
                    match r.below(3) {
                        0 => {
                            let d = [0, 2, u64::MAX, 1u64 << 40][r.below(4)];
                            s.push(json!(d));
                        }
                        1 => s.clear(),
                        _ => s = vec![json!(-1)],
                    }
                    e["shape"] = json!(s);
                }
                2 => {
                    let a = e["data_offsets"][0].as_u64().unwrap_or(0);
                    let b = [a, a + 1, u64::MAX, 0][r.below(4)];
                    e["data_offsets"] = json!([a, b]);
                }
                _ => e["data_offsets"] = bad_value(r),
            }
            let text = serde_json::to_vec(&header).unwrap();
            out = (text.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(&text);
            out.extend_from_slice(&file[8 + n..]);
        }
        4 => out.truncate(r.below(file.len())),
        5 => out.extend((0..1 + r.below(64)).map(|_| r.below(256) as u8)),
        _ => {
            let i = 8 + n + r.below(file.len() - 8 - n);
            out[i] ^= 0xFF;
        }
    }
    out
}
