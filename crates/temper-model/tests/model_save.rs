//! Save -> transformers reload round trip: transformers computes the same logprobs from the saved
//! folder as the Rust model that saved it; the saved folder reloads bit-identically in Rust.
mod common;

use common::{max_abs_diff, pad, reference, run_tool, scratch};
use serde_json::Value;
use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, ComputeKind};

fn perturb(model: &CausalLm) {
    tch::manual_seed(7);
    tch::no_grad(|| {
        for (_, mut t) in model.named_parameters() {
            let noise = t.randn_like() * 0.05;
            let _ = t.g_add_(&noise);
        }
    });
}

fn round_trip(name: &str) {
    let r = reference(name);
    let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
    perturb(&model);
    let out = scratch(&format!("save-{name}")).join("saved");
    model.save(&out).unwrap();
    assert!(
        out.join("generation_config.json").is_file(),
        "generation_config.json not copied"
    );
    let b = pad(&r.rows, true, 0, 0);
    let (logp, ent) = tch::no_grad(|| {
        model
            .token_logprobs(&b.ids, &b.mask, &b.pos, &b.targets, 1.0)
            .into_parts()
    });
    let rows = serde_json::to_string(&r.rows).unwrap();
    let py: Value = serde_json::from_str(&run_tool(
        "model_logprobs.py",
        &["--model", out.to_str().unwrap(), "--rows", &rows],
    ))
    .unwrap();
    let py_logp: Vec<Vec<f64>> = serde_json::from_value(py["logp"].clone()).unwrap();
    let py_ent: Vec<Vec<f64>> = serde_json::from_value(py["entropy"].clone()).unwrap();
    let d = max_abs_diff(&b.per_row(&logp), &py_logp);
    let de = max_abs_diff(&b.per_row(&ent), &py_ent);
    assert!(
        d <= 1e-4 && de <= 1e-4,
        "{name}: transformers on the saved folder differs: logp {d:e}, entropy {de:e}"
    );
    // The perturbation moved the numbers away from the original reference, so the check has teeth.
    assert!(
        max_abs_diff(&py_logp, &r.logp) > 1e-3,
        "{name}: perturbation had no effect"
    );
    let again = CausalLm::load(&out, Device::Cpu, ComputeKind::F32).unwrap();
    for ((n1, t1), (n2, t2)) in model
        .named_parameters()
        .iter()
        .zip(again.named_parameters().iter())
    {
        assert_eq!(n1, n2);
        assert!(t1.equal(t2), "{n1} changed in the save/load round trip");
    }
}

#[test]
fn qwen2_untied_save_reloads_in_transformers() {
    round_trip("qwen2");
}

#[test]
fn llama_tied_save_reloads_in_transformers() {
    round_trip("llama");
}

#[test]
fn qwen3_save_reloads_in_transformers() {
    round_trip("qwen3");
}

/// Saving into an existing folder replaces it; bf16 saves hold bf16-rounded master weights.
#[test]
fn save_replaces_and_saves_bf16() {
    let cfg = temper_model::ModelConfig::qwen2_like(50, 32, 48, 1, 4, 2, true);
    let model = CausalLm::random(cfg, 3, Device::Cpu, ComputeKind::F32);
    let dir = scratch("save-bf16").join("ckpt");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("stale.txt"), "old").unwrap();
    model.save_as(&dir, Kind::BFloat16, None).unwrap();
    assert!(
        !dir.join("stale.txt").exists(),
        "old folder contents survived"
    );
    let siblings: Vec<_> = std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        siblings.len(),
        1,
        "temporary folders left behind: {siblings:?}"
    );
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["dtype"], "bfloat16");
    let raw: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join("model.safetensors"))
            .unwrap()
            .into_iter()
            .collect();
    assert!(
        !raw.contains_key("lm_head.weight"),
        "tied head should not be saved"
    );
    for (name, t) in model.named_parameters() {
        assert_eq!(raw[&name].kind(), Kind::BFloat16);
        assert!(
            raw[&name].equal(&t.to_kind(Kind::BFloat16)),
            "{name} not the bf16 rounding of the master weight"
        );
    }
}

/// The writer converts and writes a slice at a time: tensors several slices long (and not a whole
/// number of them), a transposed view, a scalar and an empty tensor read back, through libtorch's
/// own safetensors reader, as exactly the tensors given (or their bf16 rounding).
#[test]
fn tensors_longer_than_a_write_slice_round_trip() {
    use temper_model::safetensors_io::write_safetensors_as;
    tch::manual_seed(3);
    let long = Tensor::randn([5_000_003], (Kind::Float, Device::Cpu));
    let tensors = [
        ("long".to_string(), long.shallow_clone()),
        (
            "wide_t".to_string(),
            Tensor::randn([700, 3_001], (Kind::Float, Device::Cpu)).tr(),
        ),
        ("step".to_string(), Tensor::from(41i64)),
        (
            "empty".to_string(),
            Tensor::zeros([0, 4], (Kind::Float, Device::Cpu)),
        ),
    ];
    let dir = scratch("write-slices");
    for dtype in [None, Some(Kind::BFloat16)] {
        let path = dir.join("t.safetensors");
        let floats: Vec<(String, Tensor)> = match dtype {
            None => tensors
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
            Some(_) => tensors
                .iter()
                .filter(|(n, _)| n != "step")
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
        };
        write_safetensors_as(&path, &floats, dtype).unwrap();
        let back: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(&path)
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(back.len(), floats.len());
        for (name, t) in &floats {
            let want = match dtype {
                Some(k) => t.to_kind(k),
                None => t.shallow_clone(),
            };
            assert_eq!(back[name].size(), want.size(), "{name}: shape");
            assert_eq!(back[name].kind(), want.kind(), "{name}: dtype");
            assert!(
                back[name].equal(&want),
                "{name} ({dtype:?}) differs after the round trip"
            );
        }
    }
}

/// A test's stand-in for a sharded run's residency: every decoder layer's matrices are let go
/// (emptied) until fetched, and it counts how many layers are whole at once.
#[derive(Debug)]
struct Elsewhere {
    /// Per layer: (parameter, its weights) of its matrices.
    layers: std::sync::Mutex<Vec<Vec<(Tensor, Tensor)>>>,
    whole: std::sync::Mutex<std::collections::BTreeSet<usize>>,
    most_whole: std::sync::atomic::AtomicUsize,
    fetches: std::sync::atomic::AtomicUsize,
}

impl Elsewhere {
    fn over(model: &CausalLm) -> std::sync::Arc<Self> {
        let mut layers: Vec<Vec<(Tensor, Tensor)>> =
            (0..model.num_layers()).map(|_| vec![]).collect();
        for (name, p) in model.named_parameters() {
            let layer = name
                .strip_prefix("model.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<usize>().ok());
            if let (Some(i), 2) = (layer, p.dim()) {
                layers[i].push((p.shallow_clone(), p.detach().copy()));
            }
        }
        let e = Self {
            layers: std::sync::Mutex::new(layers),
            whole: Default::default(),
            most_whole: Default::default(),
            fetches: Default::default(),
        };
        for i in 0..model.num_layers() {
            e.let_go(i);
        }
        std::sync::Arc::new(e)
    }

    fn let_go(&self, i: usize) {
        let empty = Tensor::empty([0], (Kind::Float, Device::Cpu));
        for (p, _) in &self.layers.lock().unwrap()[i] {
            p.shallow_clone().set_data(&empty);
        }
        self.whole.lock().unwrap().remove(&i);
    }
}

impl temper_model::LayerResidency for Elsewhere {
    fn fetch(&self, i: usize) {
        for (p, w) in &self.layers.lock().unwrap()[i] {
            p.shallow_clone().set_data(&w.copy());
        }
        let mut whole = self.whole.lock().unwrap();
        whole.insert(i);
        self.most_whole
            .fetch_max(whole.len(), std::sync::atomic::Ordering::SeqCst);
        self.fetches
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn release_after_forward(&self, i: usize) {
        self.let_go(i);
    }
    fn backward_done(&self, _i: usize) {}
}

/// `CausalLm::save_by_layer` (how a sharded run's rank 0 writes the model): with every decoder
/// layer's weights elsewhere, each is fetched, written and let go in turn (one layer whole at a
/// time), and the folder holds what `save` writes of the whole model, bit for bit, which
/// transformers loads to the same log-probs.
#[test]
fn a_model_saved_layer_by_layer_is_the_whole_models_folder() {
    let r = reference("qwen2");
    let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
    perturb(&model);
    let dir = scratch("save-by-layer");
    model.save(&dir.join("whole")).unwrap();
    let elsewhere = Elsewhere::over(&model);
    model.set_layer_residency(Some(
        elsewhere.clone() as std::sync::Arc<dyn temper_model::LayerResidency>
    ));
    model.save_by_layer(&dir.join("by_layer")).unwrap();
    let layers = model.num_layers();
    assert_eq!(
        elsewhere.fetches.load(std::sync::atomic::Ordering::SeqCst),
        layers
    );
    assert_eq!(
        elsewhere
            .most_whole
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert!(
        elsewhere.whole.lock().unwrap().is_empty(),
        "a layer was kept"
    );
    let whole = CausalLm::load(&dir.join("whole"), Device::Cpu, ComputeKind::F32).unwrap();
    let by_layer = CausalLm::load(&dir.join("by_layer"), Device::Cpu, ComputeKind::F32).unwrap();
    let (a, b) = (whole.named_parameters(), by_layer.named_parameters());
    assert_eq!(a.len(), b.len());
    for ((n1, t1), (n2, t2)) in a.iter().zip(&b) {
        assert_eq!(n1, n2);
        assert!(t1.equal(t2), "{n1} differs");
    }
    let rows = serde_json::to_string(&r.rows).unwrap();
    let py: Value = serde_json::from_str(&run_tool(
        "model_logprobs.py",
        &[
            "--model",
            dir.join("by_layer").to_str().unwrap(),
            "--rows",
            &rows,
        ],
    ))
    .unwrap();
    let py_logp: Vec<Vec<f64>> = serde_json::from_value(py["logp"].clone()).unwrap();
    let b = pad(&r.rows, true, 0, 0);
    let logp = tch::no_grad(|| {
        whole
            .token_logprobs(&b.ids, &b.mask, &b.pos, &b.targets, 1.0)
            .into_parts()
            .0
    });
    let d = max_abs_diff(&b.per_row(&logp), &py_logp);
    assert!(
        d <= 1e-4,
        "transformers on the folder written by layer: {d:e}"
    );
}
