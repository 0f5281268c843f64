//! Environment runs (`env.name`) on the tiny model: a debate trained by rejection sampling with
//! the mock judge, the one-turn qa and summary tasks, the zero-advantage stop, and bad input.
use temper_testkit as common;

use common::{temp_dir, tiny_config};
use serde_json::Value;
use temper_train::trainer::Trainer;

fn read(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn env_config(root: &std::path::Path, extra: &[&str]) -> temper_train::config::Config {
    let mut ov = vec![
        "trainer.total_training_steps=1",
        "data.max_prompt_length=1024",
        "data.train_batch_size=2",
        "actor.ppo_mini_batch_size=1",
        "actor.ppo_micro_batch_size_per_gpu=2",
        "rollout.n=4",
    ];
    ov.extend_from_slice(extra);
    tiny_config(root, &ov)
}

#[test]
fn a_debate_step_trains_the_winners_and_logs_every_file() {
    let root = temp_dir("env-debate");
    let mut t = Trainer::create(
        env_config(
            &root,
            &[
                "env.name=debate",
                "env.task=qa",
                "env.judge=mock",
                "env.debate_train=rejection",
            ],
        ),
        "d",
        &[],
    )
    .unwrap();
    let before = common::weights(&t);
    t.fit().unwrap();
    let run = t.run().root.clone();
    // 2 questions x 4 rollouts = 2 x 2 debates.
    for k in 0..4 {
        let d = read(&run.join(format!("debate_{k}.json")));
        let v = d["verdict"].as_str().unwrap();
        assert!(v == "A" || v == "B", "{v}");
        for agent in d["agents"].as_array().unwrap() {
            let rounds = agent["rounds"].as_array().unwrap();
            assert_eq!(rounds.len(), 3);
            // Each round's prompt extends the previous prompt and completion.
            for r in 1..3 {
                let prev: Vec<i64> = [
                    &rounds[r - 1]["prompt_tokens"],
                    &rounds[r - 1]["completion_tokens"],
                ]
                .iter()
                .flat_map(|a| a.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()))
                .collect();
                let this: Vec<i64> = rounds[r]["prompt_tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect();
                assert!(this.len() > prev.len() && this[..prev.len()] == prev[..]);
            }
            assert!(agent["r1_task_reward"].is_number());
        }
    }
    let step = read(&run.join("training_step_1.json"));
    let datums = step["datums"].as_array().unwrap();
    assert_eq!(datums.len(), 4, "one winner per debate");
    let mut trained = 0;
    for d in datums {
        let len = d["completion_tokens"].as_array().unwrap().len();
        assert!(len > 0);
        for key in [
            "completion_logprobs",
            "completion_advantages",
            "completion_mask",
        ] {
            assert_eq!(d[key].as_array().unwrap().len(), len, "{key}");
        }
        let mask: Vec<i64> = d["completion_mask"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect();
        let t_sampled = mask.iter().sum::<i64>();
        trained += t_sampled;
        for (a, m) in d["completion_advantages"]
            .as_array()
            .unwrap()
            .iter()
            .zip(&mask)
        {
            let want = if *m == 1 { 1.0 / t_sampled as f64 } else { 0.0 };
            assert!((a.as_f64().unwrap() - want).abs() < 1e-6);
        }
        assert!(d["group"].as_str().unwrap().starts_with("qa-"));
        assert_eq!(d["reward"].as_f64(), Some(1.0));
    }
    assert_eq!(step["num_trained_tokens"].as_i64(), Some(trained));
    assert!(step["loss"].as_f64().unwrap().is_finite());
    assert!(
        !common::same_weights(&before, &common::weights(&t)),
        "the update changed the weights"
    );
    let m: Value = serde_json::from_str(
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(m["env/debates"].as_f64(), Some(4.0));
    assert_eq!(m["env/invalid_verdicts"].as_f64(), Some(0.0));
    check_logs(&run, None);
}

#[test]
fn one_turn_tasks_stop_on_all_zero_advantages_unless_told_to_skip() {
    // The tiny model never writes <SOLUTION> tags: every reward is 0.
    let root = temp_dir("env-qa");
    let mut t = Trainer::create(env_config(&root, &["env.name=qa"]), "q", &[]).unwrap();
    let e = format!("{:#}", t.fit().unwrap_err());
    assert!(e.contains("All token advantages are 0.0"), "{e}");
    // The step's episodes were logged before it stopped.
    assert!(t.run().root.join("baseline_0.json").exists());
    let root = temp_dir("env-qa-skip");
    let mut t = Trainer::create(
        env_config(&root, &["env.name=qa", "env.skip_zero_advantage=true"]),
        "q",
        &[],
    )
    .unwrap();
    t.fit().unwrap();
    let b = read(&t.run().root.join("baseline_7.json"));
    assert_eq!(b["parse_failed"], true);
    let step = read(&t.run().root.join("training_step_1.json"));
    assert_eq!(step["num_trained_tokens"].as_i64(), Some(0));
}

/// A few articles of different lengths; the `data.train_files` override for them.
fn articles(root: &std::path::Path) -> String {
    let data = root.join("articles.jsonl");
    let mut lines = String::new();
    for i in 0..4 {
        let article = format!("Article {i}. ").repeat(20 + 10 * i);
        lines.push_str(&serde_json::json!({ "article": article }).to_string());
        lines.push('\n');
    }
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(&data, lines).unwrap();
    format!("data.train_files=[{:?}]", data.display().to_string())
}

/// tools/check_env_logs.py: every advantage (and, with Tinker's importance_sampling at ratio 1,
/// the loss) recomputed in Python from the run folder's files alone.
fn check_logs(run: &std::path::Path, loss: Option<&str>) -> String {
    let mut cmd = std::process::Command::new(common::python());
    cmd.arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/check_env_logs.py"))
        .arg(run);
    if let Some(l) = loss {
        cmd.args(["--loss", l]);
    }
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("advantages match"), "{text}");
    text
}

#[test]
fn every_debate_training_mode_matches_a_python_recomputation() {
    for (i, mode) in [
        &["env.debate_train=rs_grpo"][..],
        &["env.debate_train=rs_grpo", "env.grpo_std=true"],
        &["env.debate_train=r1_r23", "env.r23_constant=0.25"],
        &["env.debate_train=rejection"],
    ]
    .iter()
    .enumerate()
    {
        let root = temp_dir(&format!("env-modes-{i}"));
        let files = articles(&root);
        let mut ov = vec![
            "env.name=debate",
            "env.task=summary",
            "env.judge=mock",
            "actor.policy_loss.loss_mode=importance_sampling",
            "trainer.total_training_steps=2",
            "rollout.n=8",
            "env.skip_zero_advantage=true",
            files.as_str(),
        ];
        ov.extend_from_slice(mode);
        let mut t = Trainer::create(env_config(&root, &ov), "m", &[]).unwrap();
        t.fit().unwrap();
        let text = check_logs(&t.run().root, Some("importance_sampling"));
        assert!(
            text.contains("== -sum(A)"),
            "a step trained: {mode:?}\n{text}"
        );
    }
}

#[test]
fn a_judge_that_never_answers_in_format_skips_every_debate_and_counts_them() {
    // The tiny model writes no <CONFIDENCE>: every debate is INVALID, no datum is trained.
    let root = temp_dir("env-invalid");
    let mut t = Trainer::create(
        env_config(
            &root,
            &[
                "env.name=debate",
                "env.judge=confidence",
                "env.skip_zero_advantage=true",
            ],
        ),
        "i",
        &[],
    )
    .unwrap();
    t.fit().unwrap();
    let m: Value = serde_json::from_str(
        std::fs::read_to_string(t.run().root.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(m["env/invalid_verdicts"].as_f64(), Some(4.0));
    assert_eq!(m["env/datums"].as_f64(), Some(0.0));
    assert_eq!(
        read(&t.run().root.join("debate_0.json"))["verdict"],
        "INVALID"
    );
    // Sampled judges (the policy, or a frozen model) read both transcripts; their tokens are
    // logged. The tiny model does not answer <VERDICT>: all INVALID again.
    let judge_model = format!(
        "env.judge_model={:?}",
        common::tiny_model_dir().display().to_string()
    );
    for judge in [
        &["env.judge=policy"][..],
        &["env.judge=model", judge_model.as_str()],
    ] {
        let root = temp_dir(&format!("env-judge-{}", judge.len()));
        let mut ov = vec![
            "env.name=debate",
            "env.skip_zero_advantage=true",
            "env.judge_max_tokens=4",
        ];
        ov.extend_from_slice(judge);
        let mut t = Trainer::create(env_config(&root, &ov), "j", &[]).unwrap();
        t.fit().unwrap();
        let d = read(&t.run().root.join("debate_3.json"));
        assert_eq!(d["verdict"], "INVALID");
        assert!(!d["judge"]["prompt_tokens"].as_array().unwrap().is_empty());
        assert!(!d["judge"]["completion_tokens"]
            .as_array()
            .unwrap()
            .is_empty());
    }
}

#[test]
fn sat_runs_and_an_environment_run_resumes() {
    let root = temp_dir("env-sat");
    let mut t = Trainer::create(
        env_config(
            &root,
            &[
                "env.name=sat",
                "env.skip_zero_advantage=true",
                "trainer.save_freq=1",
            ],
        ),
        "sat",
        &[],
    )
    .unwrap();
    t.fit().unwrap();
    let b = read(&t.run().root.join("baseline_0.json"));
    assert!(b["question"].as_str().unwrap().starts_with("SAT Problem:"));
    // Malformed answers: correctness -0.2 and no format credit.
    assert_eq!(b["metrics"]["correctness"].as_f64(), Some(-0.2));
    let run = t.run().root.clone();
    drop(t);
    let mut t = Trainer::resume(&run, &["trainer.total_training_steps=2".to_string()]).unwrap();
    t.fit().unwrap();
    let step2 = read(&run.join("training_step_2.json"));
    assert_eq!(step2["step"], 2);
    // Step 2 numbers its records after step 1's (2 questions x 4 answers each).
    assert_eq!(read(&run.join("baseline_8.json"))["step"], 2);
}

#[test]
fn a_summary_step_logs_what_the_reward_saw() {
    let root = temp_dir("env-summary");
    let files = articles(&root);
    let mut t = Trainer::create(
        env_config(
            &root,
            &[
                "env.name=summary",
                "env.reward=compression:0.5,length:0.5",
                &files,
            ],
        ),
        "s",
        &[],
    )
    .unwrap();
    t.fit().unwrap();
    for k in 0..8 {
        let s = read(&t.run().root.join(format!("summary_{k}.json")));
        let (summary, article) = (
            s["summary"].as_str().unwrap(),
            s["article"].as_str().unwrap(),
        );
        // The reward, recomputed from the logged texts with the documented formula.
        let rho = summary.chars().count() as f64 / article.chars().count() as f64;
        let c = if summary.is_empty() {
            0.0
        } else if rho < 0.1 {
            rho / 0.1
        } else {
            (0.1 / rho).min(1.0)
        };
        let n = summary.chars().count() as f64;
        let l = if n < 50.0 {
            n / 50.0
        } else if n > 500.0 {
            (1.0 - (n - 500.0) / 500.0).max(0.0)
        } else {
            1.0
        };
        assert!((s["reward"].as_f64().unwrap() - (0.5 * c + 0.5 * l)).abs() < 1e-12);
    }
    // GRPO advantages of the one-turn groups, recomputed with verl's formula.
    check_logs(&t.run().root, None);
}

#[test]
fn bad_environment_settings_are_one_line_errors() {
    let root = temp_dir("env-bad");
    // Caught by the config's validation or when the trainer builds the environment.
    let err = |extra: &[&str]| {
        let mut ov = common::tiny_overrides(&root);
        ov.extend(
            [
                "data.max_prompt_length=1024",
                "data.train_batch_size=2",
                "actor.ppo_mini_batch_size=1",
                "rollout.n=4",
            ]
            .map(String::from),
        );
        ov.extend(extra.iter().map(|s| s.to_string()));
        let loaded = match temper_train::config::load_config(None, &ov) {
            Err(e) => return format!("{e:#}"),
            Ok(l) => l,
        };
        match Trainer::create(loaded.config, "b", &[]) {
            Ok(_) => panic!("accepted {extra:?}"),
            Err(e) => format!("{e:#}"),
        }
    };
    assert!(err(&["env.name=debate", "rollout.n=3"]).contains("must be even"));
    assert!(err(&["env.name=debate", "env.judge=model"]).contains("env.judge_model"));
    assert!(err(&["env.name=chess"]).contains("env.name"));
    // What acts on a prompt run's groups and rewards only is refused by name, not ignored.
    for key in [
        "algorithm.use_kl_in_reward",
        "algorithm.filter_groups.enable",
        "reward.overlong_buffer.enable",
    ] {
        let on = format!("{key}=true");
        let e = err(&["env.name=qa", &on]);
        assert!(
            e.contains(&format!("{key} = true with env.name")) && !e.contains('\n'),
            "{e}"
        );
    }
    assert!(err(&[
        "env.name=qa",
        "data.train_batch_size=16",
        "actor.ppo_mini_batch_size=16"
    ])
    .contains("fewer than"));
    let data = root.join("empty-article.jsonl");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(&data, "{\"article\": \"  \"}\n").unwrap();
    let files = format!("data.train_files=[{:?}]", data.display().to_string());
    assert!(err(&["env.name=summary", &files]).contains("the article is empty"));
    // A model whose tokenizer has no chat template cannot close and open debate turns.
    let bare = root.join("no-template");
    std::fs::create_dir_all(&bare).unwrap();
    for f in std::fs::read_dir(common::tiny_model_dir()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, bare.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        bare.join("tokenizer_config.json"),
        r#"{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}"#,
    )
    .unwrap();
    let model = format!("model.path={:?}", bare.display().to_string());
    let e = err(&["env.name=debate", &model]);
    assert!(e.contains("no chat template"), "{e}");
}

/// The lines of a run's metrics.jsonl.
fn metric_lines(run: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every debate and training record of a run folder, by file name.
fn records(run: &std::path::Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read_dir(run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.starts_with("debate_") || name.starts_with("training_step_")
        })
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

#[test]
fn a_debate_run_with_a_bound_of_one_plays_the_next_debates_during_the_update() {
    let debate = |name: &str, extra: &[&str]| {
        let root = temp_dir(name);
        let mut ov = vec![
            "env.name=debate",
            "env.task=qa",
            "env.judge=mock",
            "env.debate_train=rejection",
            "trainer.total_training_steps=3",
            "trainer.check_on_policy=false",
        ];
        ov.extend_from_slice(extra);
        let mut t = Trainer::create(env_config(&root, &ov), "a", &[]).unwrap();
        // Random delays before each update, so that the learner and the play end in either order.
        t.set_before_update(common::random_delays(0x2545_f491_4f6c_dd1d, 41));
        let before = common::weights(&t);
        t.fit().unwrap();
        let changed = !common::same_weights(&before, &common::weights(&t));
        (t.run().root.clone(), changed)
    };

    // Learning: step 1 plays its own debates; steps 2 and 3 train on debates played during the
    // update before them, by the weights one version older.
    let (run, changed) = debate("env-async", &["rollout.async_steps=1"]);
    assert!(changed, "the updates changed the weights");
    let m = metric_lines(&run);
    assert_eq!(m.len(), 3);
    for (i, line) in m.iter().enumerate() {
        let lag = if i == 0 { 0.0 } else { 1.0 };
        assert_eq!(
            line["rollout/policy_lag_max"].as_f64(),
            Some(lag),
            "step {}",
            i + 1
        );
        assert_eq!(
            line["rollout/policy_version"].as_f64(),
            Some(i.saturating_sub(1) as f64)
        );
        assert_eq!(line["env/debates"].as_f64(), Some(4.0));
        let (busy, wait) = (
            line["async/sampler_busy_s"].as_f64().unwrap(),
            line["async/learner_wait_s"].as_f64().unwrap(),
        );
        assert!(busy > 0.0 && wait >= 0.0);
        if i == 0 {
            assert_eq!(wait, busy, "step 1's own debates are waited for whole");
        }
    }
    for k in 0..12 {
        assert!(run.join(format!("debate_{k}.json")).exists(), "debate {k}");
    }
    check_logs(&run, None);

    // With the weights held still (lr = 0) the overlap changes nothing: every debate and every
    // training record is the lock-step run's, byte for byte (the sampler thread draws what the
    // policy draws in process).
    let still = ["actor.optim.lr=0"];
    let (sync, _) = debate("env-sync-still", &still);
    let (ahead, _) = debate("env-async-still", &[still[0], "rollout.async_steps=2"]);
    let (a, b) = (records(&sync), records(&ahead));
    assert_eq!(a.len(), 3 * 4 + 3);
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, text) in &a {
        assert!(*text == b[name], "{name} differs");
    }
}

#[test]
fn partial_rollouts_are_refused_for_an_environment_by_name() {
    let root = temp_dir("env-partial");
    let mut ov = common::tiny_overrides(&root);
    ov.extend(
        [
            "env.name=debate",
            "env.judge=mock",
            "rollout.async_steps=1",
            "rollout.partial_rollouts=true",
            "trainer.check_on_policy=false",
        ]
        .map(String::from),
    );
    let e = format!(
        "{:#}",
        temper_train::config::load_config(None, &ov).err().unwrap()
    );
    assert!(
        e.contains("rollout.partial_rollouts = true with env.name"),
        "{e}"
    );
}
