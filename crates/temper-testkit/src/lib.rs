//! Helpers shared by the integration tests of temper-train and temper-cli (a dev-dependency:
//! tests share helpers through this crate, not by including each other's files).
use std::path::PathBuf;

/// The project venv's Python (set up by scripts/setup-env.sh), the independent reference.
pub fn python() -> PathBuf {
    temper_base::python::repo_root().join(".venv/bin/python")
}

/// A TCP port free on 127.0.0.1 now (a test's rendezvous).
pub fn free_port() -> u16 {
    temper_base::net::free_port().unwrap()
}

/// Where rank `rank` of a Gloo group of `world` ranks meets the others: 127.0.0.1:`port`, this
/// process hosting the store as rank 0; a rank that does not come fails the others after a
/// minute.
pub fn gloo_rendezvous(port: u16, rank: usize, world: usize) -> temper_kernels::Rendezvous {
    temper_kernels::Rendezvous {
        host: "127.0.0.1".into(),
        port,
        rank,
        world,
        store_is_external: false,
        timeout: std::time::Duration::from_secs(60),
        backend: temper_kernels::Backend::Gloo,
    }
}

/// Rank `rank` of a Gloo group of `world` ranks ([`gloo_rendezvous`]; tests run the ranks as
/// threads).
pub fn gloo_comm(port: u16, rank: usize, world: usize) -> temper_kernels::Comm {
    temper_kernels::Comm::connect(&gloo_rendezvous(port, rank, world)).unwrap()
}

/// A `before_update` hook ([`temper_train::trainer::Trainer::set_before_update`]) that sleeps
/// 0 to `max_ms - 1` ms before each update, drawn by a xorshift from `seed`: the learner and
/// whatever runs beside it end in either order.
pub fn random_delays(seed: u64, max_ms: u64) -> temper_train::trainer::ParamsHook {
    let mut state = seed;
    Box::new(move |_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        std::thread::sleep(std::time::Duration::from_millis(state % max_ms));
    })
}

/// Copies the folder `from` to `to` (a run folder, to resume it twice).
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// A fresh, empty temporary folder unique to this test, inside this test process's own folder,
/// which is removed when the process exits (tests write checkpoints: left behind, one suite run
/// filled 8 GB of /tmp). `TEMPER_KEEP_TEST_DIRS=1` keeps it, to look at after a failure.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let d = process_dir().join(format!(
        "temper-train-{tag}-{}",
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// This test process's folder under the system's temporary folder, removed at exit.
fn process_dir() -> &'static PathBuf {
    use std::sync::OnceLock;
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    extern "C" fn remove_at_exit() {
        if let Some(d) = DIR.get() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    extern "C" {
        fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
    }
    DIR.get_or_init(|| {
        let keep = std::env::var_os("TEMPER_KEEP_TEST_DIRS").is_some_and(|v| !v.is_empty());
        if !keep {
            // SAFETY: registers a plain function, which only removes a folder, to run at exit.
            unsafe { atexit(remove_at_exit) };
        }
        std::env::temp_dir().join(format!("temper-tests-{}", std::process::id()))
    })
}

/// Runs a reference script from temper-train's tests/py with arguments; panics with its stderr on
/// failure.
pub fn run_py(script: &str, args: &[&std::path::Path]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../temper-train/tests/py")
        .join(script);
    let out = std::process::Command::new(python())
        .arg(path)
        .args(args)
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// GPT-2's byte -> printable-char map, for a byte-level BPE tokenizer without merges.
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        out[*b as usize] = char::from_u32(c).unwrap();
    }
    out
}

pub const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A tiny random Qwen2-shaped model (vocab 260: 256 bytes + 3 specials + 1 spare) with a
/// byte-level tokenizer and a ChatML template, saved as an HF folder once per test binary.
pub fn tiny_model_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = temp_dir("tiny-model");
        let cfg = temper_model::ModelConfig::qwen2_like(260, 32, 64, 2, 4, 2, true);
        let model = temper_model::CausalLm::random(cfg, 3, tch::Device::Cpu, temper_model::ComputeKind::F32);
        model.save(&dir).unwrap();
        let chars = byte_chars();
        let mut vocab = serde_json::Map::new();
        for (i, c) in chars.iter().enumerate() {
            vocab.insert(c.to_string(), serde_json::json!(i));
        }
        let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
        let added: Vec<_> = specials
            .iter()
            .enumerate()
            .map(|(i, s)| {
                serde_json::json!({"id": 256 + i, "content": s, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        for (i, s) in specials.iter().enumerate() {
            vocab.insert(s.to_string(), serde_json::json!(256 + i));
        }
        let bl = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let tok = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null, "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": []}
        });
        std::fs::write(dir.join("tokenizer.json"), serde_json::to_string(&tok).unwrap()).unwrap();
        let tc = serde_json::json!({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML});
        std::fs::write(dir.join("tokenizer_config.json"), tc.to_string()).unwrap();
        std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": 258}"#).unwrap();
        dir
    })
    .clone()
}

/// A test reward: a name and a score of the response alone.
pub struct OfResponse {
    pub name: &'static str,
    pub score: fn(&str) -> temper_reward::RewardOutput,
}

impl temper_reward::Reward for OfResponse {
    fn name(&self) -> &str {
        self.name
    }
    fn score(
        &self,
        _: &str,
        completion: &str,
        _: &str,
        _: &serde_json::Value,
    ) -> temper_reward::RewardOutput {
        (self.score)(completion)
    }
}

/// A reward with a spread on random text: the fraction of ASCII characters in the completion.
pub const ASCII_FRACTION: OfResponse = OfResponse {
    name: "ascii_fraction",
    score: |completion| {
        let n = completion.chars().count().max(1) as f64;
        temper_reward::RewardOutput::new(
            completion.chars().filter(|c| c.is_ascii()).count() as f64 / n,
        )
    },
};

/// A config for a few fast steps of GRPO on the tiny model (arith prompts, raw template).
pub fn tiny_config(root: &std::path::Path, extra: &[&str]) -> temper_train::config::Config {
    let mut ov = tiny_overrides(root);
    ov.extend(extra.iter().map(|s| s.to_string()));
    temper_train::config::load_config(None, &ov).unwrap().config
}

/// [`tiny_config`] as `key=value` overrides (for `temper train` on the command line).
pub fn tiny_overrides(root: &std::path::Path) -> Vec<String> {
    vec![
        format!("model.path={:?}", tiny_model_dir().display().to_string()),
        "data.task=arith".into(),
        "data.task_train_size=32".into(),
        "data.task_val_size=4".into(),
        "data.prompt_template=raw".into(),
        "data.max_prompt_length=32".into(),
        "data.max_response_length=6".into(),
        "data.train_batch_size=4".into(),
        "actor.ppo_mini_batch_size=2".into(),
        "actor.ppo_micro_batch_size_per_gpu=4".into(),
        "actor.optim.lr=1e-2".into(),
        "rollout.n=4".into(),
        "reward.name=arith".into(),
        "trainer.total_training_steps=3".into(),
        "trainer.check_on_policy=true".into(),
        "trainer.progress=false".into(),
        "trainer.threads=1".into(),
        format!("trainer.default_local_dir={:?}", root.display().to_string()),
        "trainer.experiment_name=run".into(),
    ]
}

/// The records of a run's `rollouts/step_<step>.jsonl`, one per sample.
pub fn rollouts(run: &std::path::Path, step: usize) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join(format!("rollouts/step_{step}.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A detached copy of every weight of the trainer's model (to compare runs; a sharded run's
/// layers gathered, so every rank calls it).
pub fn weights(t: &temper_train::trainer::Trainer) -> Vec<(String, tch::Tensor)> {
    t.whole_model()
        .unwrap()
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.detach().copy()))
        .collect()
}

/// Whether two weight lists (from [`weights`]) are bitwise equal.
pub fn same_weights(a: &[(String, tch::Tensor)], b: &[(String, tch::Tensor)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((na, ta), (nb, tb))| na == nb && ta.equal(tb))
}

/// Runs `cmd` to the end and returns its output, failing the test (with the command and what it
/// printed on stderr) when it does not exit 0.
pub fn output_ok(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
