//! Limits on every size the model layer takes from a file or a flag. Each is checked before
//! anything is allocated or read, so a wrong or hostile value is an error naming the field, not
//! an out-of-memory abort, a hang or an overflow. The values are generous: K3 itself uses a
//! small fraction of each (figures below).
//!
//! | what | limit | K3 | why this value |
//! |---|---|---|---|
//! | `config.json` bytes | [`CONFIG_FILE_MAX`] 1 MiB | ~4 KiB | a config is a few KiB; `/dev/zero` must fail at once |
//! | `model.safetensors.index.json` bytes | [`INDEX_FILE_MAX`] 256 MiB | ~60 MB | ~115 B per entry × ~530k tensors, 4× margin |
//! | `k3 op --params` bytes | [`PARAMS_FILE_MAX`] 64 MiB | - | host metadata arrays of a large batch fit many times |
//! | any dimension or count in `config.json` | [`MAX_DIM`] 2^24 | vocab 163,840 | products of two dimensions stay below 2^48 (exact in f64, far from u64 overflow) |
//! | `num_hidden_layers` | [`MAX_LAYERS`] 4,096 | 93 | every layer is listed in the layer map |
//! | `num_experts` | [`MAX_EXPERTS`] 65,536 | 896 | one router row and six tensors per expert and layer |
//! | tensors a config asks for | [`MAX_TENSORS`] 2^22 | ~530k | the inspector and loader hold one entry per tensor |
//! | positions of one sequence (`k3 run`) | the config's `max_position_embeddings`, else [`DEFAULT_MAX_CONTEXT`] | 1,048,576 | the model's context; the run sizes its cache for it |
//! | logits kept for `--logits-out` | [`LOGITS_OUT_MAX_BYTES`] 4 GiB | - | positions × vocab × 4 B are held in memory before writing |

/// Bytes read at most from `config.json`.
pub const CONFIG_FILE_MAX: u64 = 1 << 20;
/// Bytes read at most from `model.safetensors.index.json`.
pub const INDEX_FILE_MAX: u64 = 256 << 20;
/// Bytes read at most from a `k3 op --params` file.
pub const PARAMS_FILE_MAX: u64 = 64 << 20;
/// Largest dimension or count accepted from `config.json`.
pub const MAX_DIM: usize = 1 << 24;
/// Largest `num_hidden_layers`.
pub const MAX_LAYERS: usize = 4096;
/// Largest `num_experts`.
pub const MAX_EXPERTS: usize = 1 << 16;
/// Most tensors a config may ask a checkpoint to hold (an upper bound computed from the config
/// before any list of them is built).
pub const MAX_TENSORS: u64 = 1 << 22;
/// Context of a model whose config gives no `max_position_embeddings`.
pub const DEFAULT_MAX_CONTEXT: usize = 1 << 17;
/// Largest logits array `k3 run --logits-out` keeps in memory.
pub const LOGITS_OUT_MAX_BYTES: u64 = 4 << 30;
