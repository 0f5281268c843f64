use temper_train::config::{expand_sweeps, load_config, parse_override, Config};

fn load(text: &str, overrides: &[&str]) -> anyhow::Result<Config> {
    let dir = std::env::temp_dir().join(format!("temper-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("c{}.toml", rand_id()));
    std::fs::write(&p, text).unwrap();
    let ov: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    let r = load_config(Some(&p), &ov).map(|l| l.config);
    std::fs::remove_file(&p).ok();
    r
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

const MIN: &str = "[model]\npath = \"m\"\n[data]\ntask = \"arithmetic\"\n";

#[test]
fn defaults_are_verls() {
    let c = load(MIN, &[]).unwrap();
    assert_eq!(c.actor.optim.lr, 1e-6);
    assert_eq!(c.actor.optim.weight_decay, 0.01);
    assert_eq!(c.actor.optim.betas, [0.9, 0.999]);
    assert_eq!(c.actor.clip_ratio, 0.2);
    assert_eq!(c.actor.clip_low(), 0.2);
    assert_eq!(c.actor.clip_ratio_c, Some(3.0));
    assert_eq!(c.actor.loss_agg_mode, "token-mean".parse().unwrap());
    assert_eq!(c.actor.kl_loss_type, "low_var_kl".parse().unwrap());
    assert_eq!(c.actor.kl_loss_coef, 0.001);
    assert_eq!(c.actor.ppo_mini_batch_size, 256);
    assert_eq!(c.actor.grad_clip, 1.0);
    assert_eq!(c.data.train_batch_size, 1024);
    assert_eq!(c.data.max_prompt_length, 512);
    assert_eq!(c.rollout.n, 1);
    assert_eq!(c.trainer.total_epochs, 30);
    assert_eq!(c.trainer.default_local_dir, "runs");
    assert!(c.algorithm.norm_adv_by_std_in_grpo);
}

#[test]
fn overrides_parse_values_as_toml() {
    let c = load(
        MIN,
        &[
            "actor.policy_loss.loss_mode=cispo",
            "actor.optim.lr=1e-5",
            "actor.optim.betas=[0.9, 0.95]",
            "trainer.check_on_policy=true",
            "rollout.stop=[\"</answer>\"]",
            "data.task_args.digits=2",
        ],
    )
    .unwrap();
    assert_eq!(c.actor.policy_loss.loss_mode, "cispo".parse().unwrap());
    assert_eq!(c.actor.optim.lr, 1e-5);
    assert_eq!(c.actor.optim.betas, [0.9, 0.95]);
    assert!(c.trainer.check_on_policy);
    assert_eq!(c.rollout.stop, vec!["</answer>".to_string()]);
    assert_eq!(c.data.task_args["digits"].as_integer(), Some(2));
}

#[test]
fn verl_paths_are_aliases() {
    let c = load(
        MIN,
        &[
            "actor_rollout_ref.actor.clip_ratio_low=10",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.optim.warmup_style=cosine",
            "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
            "data.train_batch_size=512",
            "actor.lr=3e-6",
            "actor.epochs_per_rollout_batch=2",
            "trainer.max_actor_ckpt_to_keep=2",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
        ],
    )
    .unwrap();
    assert_eq!(c.actor.clip_ratio_low, Some(10.0));
    assert_eq!(c.actor.clip_high(), 0.2);
    assert_eq!(c.rollout.n, 8);
    assert_eq!(c.actor.optim.lr_scheduler_type.name(), "cosine");
    assert_eq!(c.eval.temperature, 0.6);
    assert_eq!(c.data.train_batch_size, 512);
    assert_eq!(c.actor.optim.lr, 3e-6);
    assert_eq!(c.actor.ppo_epochs, 2);
    assert_eq!(c.trainer.max_ckpt_to_keep, Some(2));
}

#[test]
fn verl_nested_tables_in_file() {
    let text = format!(
        "{MIN}[actor_rollout_ref.actor.policy_loss]\nloss_mode = \"gspo\"\n[actor_rollout_ref.actor.optim]\nlr = 2e-6\n"
    );
    let c = load(&text, &[]).unwrap();
    assert_eq!(c.actor.policy_loss.loss_mode, "gspo".parse().unwrap());
    assert_eq!(c.actor.optim.lr, 2e-6);
}

#[test]
fn unknown_key_names_key_file_and_suggestion() {
    let e = load(&format!("{MIN}[actor.optim]\nlrr = 1.0\n"), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown key `actor.optim.lrr`"), "{e}");
    assert!(e.contains("did you mean `actor.optim.lr`"), "{e}");
    assert!(e.contains(".toml"), "{e}");
    let e = load(MIN, &["rollout.temprature=1"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("override `rollout.temprature=1`"), "{e}");
    assert!(e.contains("did you mean `rollout.temperature`"), "{e}");
    // Right key, wrong section.
    let e = load(MIN, &["actor.n=4"]).unwrap_err().to_string();
    assert!(e.contains("unknown key `actor.n`"), "{e}");
    let e = load(MIN, &["zzz.qqq=4"]).unwrap_err().to_string();
    assert!(
        e.contains("unknown key `zzz.qqq`") && !e.contains("did you mean"),
        "{e}"
    );
}

#[test]
fn wrong_type_names_key() {
    let e = load(MIN, &["actor.optim.lr=fast"]).unwrap_err().to_string();
    assert!(e.contains("actor.optim.lr"), "{e}");
    let e = load(&format!("{MIN}[rollout]\nn = \"four\"\n"), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rollout.n") && e.contains(".toml"), "{e}");
}

#[test]
fn bad_values_are_rejected_with_the_key() {
    for (ov, key) in [
        (
            "actor.optim.lr_scheduler_type=linear",
            "actor.optim.lr_scheduler_type",
        ),
        ("data.train_batch_size=0", "data.train_batch_size"),
        ("rollout.top_p=0", "rollout.top_p"),
        ("actor.optim.lr=-1", "actor.optim.lr"),
        ("actor.ppo_mini_batch_size=3", "actor.ppo_mini_batch_size"),
        ("data.truncation=middle", "data.truncation"),
        ("rollout.backend=ollama", "rollout.backend"),
        ("rollout.weight_sync=nccl", "rollout.weight_sync"),
        ("rollout.async_steps=9", "rollout.async_steps"),
    ] {
        let e = load(MIN, &[ov]).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains(key), "{ov}: {e}");
    }
    let e = format!("{:#}", load("[data]\ntask = \"x\"\n", &[]).unwrap_err());
    assert!(e.contains("model.path"), "{e}");
}

#[test]
fn a_key_set_twice_through_an_alias_is_an_error() {
    let e = load(
        &format!("{MIN}[actor]\nlr = 1e-6\n[actor.optim]\nlr = 2e-6\n"),
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("set twice"), "{e}");
}

#[test]
fn resolved_config_round_trips() {
    let c = load(
        MIN,
        &[
            "actor.clip_ratio_high=0.28",
            "trainer.total_training_steps=7",
        ],
    )
    .unwrap();
    let text = toml::to_string_pretty(&c).unwrap();
    let c2 = load(&text, &[]).unwrap();
    assert_eq!(c, c2);
}

#[test]
fn override_values() {
    assert_eq!(parse_override("a.b=1e-6").unwrap().1.as_float(), Some(1e-6));
    assert_eq!(
        parse_override("a.b=cispo").unwrap().1.as_str(),
        Some("cispo")
    );
    assert_eq!(parse_override("a.b=\"1\"").unwrap().1.as_str(), Some("1"));
    assert!(parse_override("a.b").is_err());
    assert!(parse_override("a..b=1").is_err());
}

#[test]
fn sweeps_are_a_cartesian_product() {
    let runs = expand_sweeps(&[
        "actor.optim.lr=1e-6,1e-5".into(),
        "rollout.stop=[\"a\",\"b\"],[]".into(),
    ])
    .unwrap();
    assert_eq!(runs.len(), 4);
    assert_eq!(
        runs[0].overrides,
        vec!["actor.optim.lr=1e-6", "rollout.stop=[\"a\",\"b\"]"]
    );
    assert_eq!(
        runs[3].overrides,
        vec!["actor.optim.lr=1e-5", "rollout.stop=[]"]
    );
    assert_eq!(runs[1].tag, "lr=1e-6,stop=__");
    assert!(runs[0].tag != runs[1].tag);
    assert_eq!(expand_sweeps(&[]).unwrap().len(), 1);
    assert!(expand_sweeps(&["x".into()]).is_err());
}

#[test]
fn bad_algorithm_names_name_the_key() {
    for (ov, key) in [
        (
            "actor.policy_loss.loss_mode=ppo2",
            "actor.policy_loss.loss_mode",
        ),
        ("actor.loss_agg_mode=mean", "actor.loss_agg_mode"),
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator"),
        ("actor.kl_loss_type=k9", "actor.kl_loss_type"),
        (
            "algorithm.rollout_correction.rollout_is=batch",
            "algorithm.rollout_correction.rollout_is",
        ),
        // The config's other fixed choices, parsed when the config loads.
        ("rollout.backend=vlm", "rollout.backend"),
        ("rollout.weight_sync=nfs", "rollout.weight_sync"),
        ("data.truncation=middle", "data.truncation"),
        ("data.answer_extract=math", "data.answer_extract"),
        ("model.dtype=f32", "model.dtype"),
        ("trainer.device=tpu", "trainer.device"),
        ("reward.on_error=skip", "reward.on_error"),
        (
            "algorithm.filter_groups.metric=accuracy",
            "algorithm.filter_groups.metric",
        ),
        (
            "actor.optim.lr_scheduler_type=linear",
            "actor.optim.lr_scheduler_type",
        ),
        ("algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type"),
    ] {
        let e = format!("{:#}", load(MIN, &[ov]).unwrap_err());
        assert!(e.contains(key) && e.contains("known: "), "{ov}: {e}");
    }
    // A near miss gets a did-you-mean; an alias loads as its canonical name.
    let e = format!("{:#}", load(MIN, &["rollout.backend=vlm"]).unwrap_err());
    assert!(e.contains("(did you mean `vllm`?)"), "{e}");
    let e = format!(
        "{:#}",
        load(MIN, &["actor.policy_loss.loss_mode=cispoo"]).unwrap_err()
    );
    assert!(e.contains("(did you mean `cispo`?)"), "{e}");
    let c = load(
        MIN,
        &[
            "rollout.backend=sglang_server",
            "rollout.base_urls=[\"http://x\"]",
        ],
    )
    .unwrap();
    assert_eq!(c.rollout.backend.name(), "sglang");
}

/// Every shipped example loads and validates, and the convention-specific ones mean what they say.
#[test]
fn shipped_examples_load() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let l = load_config(Some(&p), &[]).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
            assert!(l.warnings.is_empty(), "{}: {:?}", p.display(), l.warnings);
            seen += 1;
        }
    }
    assert!(seen >= 8, "only {seen} examples");
    let ex = |name: &str| load_config(Some(&dir.join(name)), &[]).unwrap().config;
    let slime = ex("cispo-slime.toml");
    assert_eq!(
        (slime.actor.clip_low(), slime.actor.clip_high()),
        (1.0, 4.0)
    );
    let verl = ex("cispo-verl.toml");
    assert_eq!((verl.actor.clip_low(), verl.actor.clip_high()), (10.0, 0.2));
    let cs = ex("cs336-grpo.toml");
    assert_eq!(cs.actor.ppo_epochs, 1);
    assert_eq!(cs.actor.optim.betas, [0.9, 0.95]);
    assert_eq!(cs.data.train_batch_size * cs.rollout.n, 256);
    assert_eq!(ex("arith-smollm2.toml").model.path, "smollm2");
}

#[test]
fn remote_rollout_settings_are_checked_together() {
    let remote = [
        "rollout.backend=vllm",
        "rollout.base_urls=[\"http://127.0.0.1:30000\"]",
    ];
    let with = |extra: &[&str]| -> anyhow::Result<Config> {
        let all: Vec<&str> = remote.iter().chain(extra).copied().collect();
        load(MIN, &all)
    };
    assert_eq!(
        with(&["rollout.async_steps=2"])
            .unwrap()
            .rollout
            .async_steps,
        2
    );
    for (extra, want) in [
        (vec!["rollout.async_steps=9"], "rollout.async_steps = 9"),
        (vec!["rollout.sync_every=0"], "rollout.sync_every"),
        (
            vec!["rollout.async_steps=1", "trainer.check_on_policy=true"],
            "trainer.check_on_policy needs rollout.async_steps = 0",
        ),
    ] {
        let e = format!("{:#}", with(&extra).unwrap_err());
        assert!(e.contains(want), "{extra:?}: {e}");
    }
    let e = format!("{:#}", load(MIN, &["rollout.backend=sglang"]).unwrap_err());
    assert!(e.contains("needs rollout.base_urls"), "{e}");
    // grail's keys and names.
    let c = load(
        MIN,
        &[
            "generation.backend=vllm_server",
            "generation.base_url=http://h:8000",
        ],
    )
    .unwrap();
    assert_eq!(c.rollout.backend.name(), "vllm");
    assert_eq!(c.rollout.base_urls, vec!["http://h:8000".to_string()]);
}

/// verl's command lines are Hydra: its spellings of booleans, nulls and lists, `+` / `++` / `~`.
#[test]
fn hydra_overrides_as_verl_scripts_write_them() {
    let c = load(
        MIN,
        &[
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
            "actor_rollout_ref.actor.clip_ratio_low=10",
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.kl_loss_coef=0.001",
            "algorithm.use_kl_in_reward=False",
            "+trainer.val_before_train=false",
            "actor_rollout_ref.model.enable_gradient_checkpointing=True",
            "trainer.logger=['console','wandb']",
            "actor_rollout_ref.rollout.stop=[</answer>,'a,b']",
            "++actor.shuffle=True",
            "actor.clip_ratio_c=null",
        ],
    )
    .unwrap();
    assert!(c.actor.use_kl_loss);
    assert!(!c.algorithm.use_kl_in_reward);
    assert!(!c.trainer.val_before_train);
    assert!(c.actor.shuffle);
    assert_eq!(c.actor.clip_ratio_low, Some(10.0));
    assert_eq!(c.actor.policy_loss.loss_mode, "cispo".parse().unwrap());
    assert_eq!(c.rollout.stop, ["</answer>", "a,b"]);
    // null: temper's default.
    assert_eq!(c.actor.clip_ratio_c, Some(3.0));
    // `~` removes a key the file set.
    let c = load(
        &format!("{MIN}[actor]\nshuffle = true\n"),
        &["~actor.shuffle"],
    )
    .unwrap();
    assert!(!c.actor.shuffle);
    // Quoted strings may hold `=` and `,`.
    let c = load(MIN, &["trainer.experiment_name='a=b,c'"]).unwrap();
    assert_eq!(c.trainer.experiment_name, "a=b,c");
}

#[test]
fn malformed_hydra_overrides_are_one_line_errors_naming_them() {
    let err = |o: &str, file: &str| {
        let e = format!("{:#}", load(file, &[o]).unwrap_err());
        assert!(!e.contains('\n'), "one line: {e}");
        e
    };
    let e = err("rollout.stop=['a'", MIN);
    assert!(
        e.contains("override `rollout.stop=['a'`") && e.contains("unbalanced"),
        "{e}"
    );
    let e = err("trainer.experiment_name='abc", MIN);
    assert!(e.contains("unclosed ' quote"), "{e}");
    let e = err(
        "+actor.shuffle=true",
        &format!("{MIN}[actor]\nshuffle = false\n"),
    );
    assert!(
        e.contains("already set") && e.contains("++actor.shuffle=true"),
        "{e}"
    );
    let e = err("~actor.shuffle", MIN);
    assert!(e.contains("`actor.shuffle` is not set"), "{e}");
    let e = err("trainer.experiment_name=${oc.env:USER}", MIN);
    assert!(e.contains("interpolation"), "{e}");
    let e = err("actor.shufle=True", MIN);
    assert!(e.contains("actor.shuffle"), "did-you-mean: {e}");
}

/// The override arguments of 47 of verl's own GRPO-family run scripts (argv after shell
/// unquoting, tests/fixtures/verl_scripts.txt) all parse in temper's Hydra grammar.
#[test]
fn every_override_of_verls_example_scripts_parses() {
    let text = include_str!("fixtures/verl_scripts.txt");
    let (mut scripts, mut lines) = (0, 0);
    for line in text.lines() {
        if line.starts_with("## ") {
            scripts += 1;
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        lines += 1;
        if let Err(e) = temper_train::config::parse_hydra_override(line) {
            panic!("{line}: {e:#}");
        }
    }
    assert!(
        scripts >= 20 && lines > 1000,
        "{scripts} scripts, {lines} lines"
    );
}

/// What a rollout server would refuse at the first rollout is a config error naming the key.
#[test]
fn sampling_settings_a_rollout_server_refuses_are_config_errors() {
    let remote = |backend: &str, extra: &str| {
        load(
            MIN,
            &[
                &format!("rollout.backend={backend:?}"),
                "rollout.base_urls=[\"http://127.0.0.1:9\"]",
                extra,
            ],
        )
    };
    let e = format!(
        "{:#}",
        remote("vllm", "rollout.temperature=3.0").unwrap_err()
    );
    assert!(
        e.contains("rollout.temperature = 3") && e.contains("vLLM"),
        "{e}"
    );
    assert!(remote("openai", "rollout.temperature=3.0").is_ok());
    assert!(remote("vllm", "rollout.temperature=1.5").is_ok());
}

/// verl's fully-async keys are refused by name, pointing at temper's bound.
#[test]
fn verls_fully_async_keys_point_at_rollout_async_steps() {
    for key in [
        "async_training.staleness_threshold=0.5",
        "async_training.trigger_parameter_sync_step=4",
        "async_training.partial_rollout=True",
    ] {
        let e = format!("{:#}", load(MIN, &[key]).unwrap_err());
        assert!(
            e.contains("cannot apply in temper") && e.contains("rollout.async_steps"),
            "{key}: {e}"
        );
    }
}

/// Partial rollouts need overlap and the in-process sampler: one line naming the key.
#[test]
fn partial_rollouts_need_overlap_in_process() {
    let ok = load(
        MIN,
        &["rollout.async_steps=1", "rollout.partial_rollouts=true"],
    )
    .unwrap();
    assert!(ok.rollout.partial_rollouts);
    for (extra, want) in [
        (
            vec!["rollout.partial_rollouts=true"],
            "rollout.partial_rollouts = true needs rollout.async_steps >= 1",
        ),
        (
            vec![
                "rollout.partial_rollouts=true",
                "rollout.async_steps=1",
                "rollout.backend=vllm",
                "rollout.base_urls=[\"http://127.0.0.1:30000\"]",
            ],
            "partial rollouts need the in-process sampler",
        ),
        (
            vec![
                "rollout.recompute_kv_after_update=true",
                "rollout.async_steps=1",
            ],
            "rollout.recompute_kv_after_update = true needs rollout.partial_rollouts = true",
        ),
    ] {
        let e = format!("{:#}", load(MIN, &extra).unwrap_err());
        assert!(e.contains(want) && !e.contains('\n'), "{extra:?}: {e}");
    }
}
