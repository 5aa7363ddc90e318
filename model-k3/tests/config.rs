//! Config parsing: the tiny config, the production K3 layer map, and clear errors.

use model_k3::config::{FfnKind, K3Config, KdaGate, MixerKind, TINY_CONFIG_JSON};
use serde_json::{json, Value};

fn tiny() -> Value {
    serde_json::from_str(TINY_CONFIG_JSON).unwrap()
}

fn field_of(r: kernel_api::Result<K3Config>) -> String {
    match r {
        Err(kernel_api::Error::InvalidInput { field, .. }) => field,
        Err(kernel_api::Error::Unsupported { reasons }) => reasons[0].subject.clone(),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn tiny_config_layer_map() {
    let c = K3Config::from_json(&tiny()).unwrap();
    assert_eq!(c.mixers, vec![MixerKind::Kda, MixerKind::Kda, MixerKind::Kda, MixerKind::Mla, MixerKind::Mla]);
    assert_eq!(c.ffns[0], FfnKind::Dense);
    assert!(c.ffns[1..].iter().all(|f| *f == FfnKind::LatentMoe));
    assert_eq!(c.kda.gate, KdaGate::LowerBound(-5.0));
    assert!(c.kda.full_rank_output_gate);
    assert_eq!(c.mla.qk_head_dim(), 48);
    assert_eq!(c.mla.cache_width(), 80);
    assert_eq!(c.mla_norm_eps, 1e-6);
    assert_eq!(c.situ_linear_beta, Some(25.0));
    assert_eq!((c.bos_token_id, c.eos_token_id, c.pad_token_id), (Some(1), Some(2), Some(511)));
    // AttnRes snapshots at layers 0, 2, 4 for block size 2.
    assert_eq!((0..5).filter(|&i| c.is_block_start(i)).collect::<Vec<_>>(), vec![0, 2, 4]);
}

/// The production config's layer lists: MLA at every 4th layer plus the last (0-based 3, 7, ..,
/// 91, 92), KDA everywhere else: 69 + 24.
#[test]
fn k3_production_layer_map() {
    let mut v = tiny();
    let t = v.get_mut("text_config").unwrap();
    let full: Vec<u64> = (1..=23).map(|i| 4 * i).chain([93]).collect();
    let kda: Vec<u64> = (1..=93).filter(|i| !full.contains(i)).collect();
    t["num_hidden_layers"] = json!(93);
    t["linear_attn_config"]["full_attn_layers"] = json!(full);
    t["linear_attn_config"]["kda_layers"] = json!(kda);
    t["attn_res_block_size"] = json!(12);
    let c = K3Config::from_json(&v).unwrap();
    assert_eq!(c.kda_layers().count(), 69);
    let mla: Vec<usize> = c.mla_layers().collect();
    assert_eq!(mla.len(), 24);
    assert_eq!(&mla[..2], &[3, 7]);
    assert_eq!(&mla[22..], &[91, 92]);
    assert_eq!((0..93).filter(|&i| c.is_block_start(i)).collect::<Vec<_>>(), vec![0, 12, 24, 36, 48, 60, 72, 84]);
}

#[test]
fn root_without_text_config_is_accepted() {
    let v = tiny()["text_config"].clone();
    assert!(K3Config::from_json(&v).is_ok());
}

#[test]
fn missing_and_contradictory_keys_are_named() {
    let mut v = tiny();
    v["text_config"].as_object_mut().unwrap().remove("kv_lora_rank");
    assert_eq!(field_of(K3Config::from_json(&v)), "kv_lora_rank");

    let mut v = tiny();
    v["text_config"]["linear_attn_config"]["kda_layers"] = json!([1, 2, 3, 4]);
    assert_eq!(field_of(K3Config::from_json(&v)), "linear_attn_config.full_attn_layers");

    let mut v = tiny();
    v["text_config"]["linear_attn_config"]["kda_layers"] = json!([1, 2]);
    assert_eq!(field_of(K3Config::from_json(&v)), "linear_attn_config");

    let mut v = tiny();
    v["text_config"]["linear_attn_config"]["full_attn_layers"] = json!([4, 6]);
    assert_eq!(field_of(K3Config::from_json(&v)), "linear_attn_config.full_attn_layers");

    let mut v = tiny();
    v["text_config"]["rope_theta"] = json!(10000.0);
    assert_eq!(field_of(K3Config::from_json(&v)), "rope_theta");

    let mut v = tiny();
    v["text_config"]["num_experts_per_token"] = json!(17);
    assert_eq!(field_of(K3Config::from_json(&v)), "num_experts_per_token");

    let mut v = tiny();
    v["text_config"]["num_key_value_heads"] = json!(1);
    assert_eq!(field_of(K3Config::from_json(&v)), "num_key_value_heads");

    let mut v = tiny();
    v["text_config"]["hidden_act"] = json!("silu");
    assert_eq!(field_of(K3Config::from_json(&v)), "hidden_act");

    assert_eq!(field_of(K3Config::from_json_str("{not json")), "config.json");
}

#[test]
fn kimi_linear_companion_variant() {
    let mut v = tiny();
    let lac = &mut v["text_config"]["linear_attn_config"];
    lac.as_object_mut().unwrap().remove("gate_lower_bound");
    lac["use_full_rank_gate"] = json!(false);
    let c = K3Config::from_json(&v).unwrap();
    assert_eq!(c.kda.gate, KdaGate::Softplus);
    assert!(!c.kda.full_rank_output_gate);
}
