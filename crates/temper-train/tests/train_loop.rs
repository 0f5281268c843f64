//! End-to-end loop tests on a tiny random model (seconds each).
use common::{same_weights, tiny_config, weights, OfResponse, ASCII_FRACTION};
use std::collections::BTreeMap;
use temper_testkit as common;
use temper_train::trainer::Trainer;

#[path = "train_loop/equivalent_runs.rs"]
mod equivalent_runs;

fn metrics(t: &Trainer) -> Vec<BTreeMap<String, serde_json::Value>> {
    t.run().read_metrics().unwrap()
}

#[test]
fn a_run_trains_and_fills_its_folder() {
    let root = common::temp_dir("run");
    let cfg = tiny_config(
        &root,
        &[
            "trainer.test_freq=2",
            "trainer.save_freq=2",
            "trainer.max_ckpt_to_keep=1",
            "eval.n=3",
            "eval.do_sample=true",
            "eval.temperature=1.0",
        ],
    );
    let mut t = Trainer::create(cfg, "t", &["temper".into(), "train".into()]).unwrap();
    t.set_reward(Box::new(ASCII_FRACTION));
    let before = weights(&t);
    t.fit().unwrap();
    assert!(
        !same_weights(&before, &weights(&t)),
        "weights did not change"
    );
    let run = &t.run().root;
    for f in [
        "config.toml",
        "run_metadata.json",
        "metrics.jsonl",
        "rollouts/step_1.jsonl",
        "eval/step_0.json",
        "eval/step_2.json",
        "eval/step_3.json",
    ] {
        assert!(run.join(f).is_file(), "missing {f}");
    }
    // save_freq 2 and the end (3), keeping only the newest.
    let ckpts: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(ckpts, vec!["global_step_3".to_string()]);
    let ck = run.join("checkpoints/global_step_3");
    for f in [
        "model/model.safetensors",
        "model/config.json",
        "model/tokenizer.json",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(ck.join(f).is_file(), "checkpoint lacks {f}");
    }
    let m = metrics(&t);
    assert_eq!(
        m.iter()
            .map(|l| l["step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    for key in [
        "actor/pg_loss",
        "actor/ppo_kl",
        "actor/pg_clipfrac",
        "actor/pg_clipfrac_lower",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
        "critic/score/mean",
        "critic/score/max",
        "critic/score/min",
        "critic/rewards/mean",
        "critic/advantages/mean",
        "critic/advantages/max",
        "critic/advantages/min",
        "response_length/mean",
        "response_length/max",
        "response_length/clip_ratio",
        "prompt_length/mean",
        "rollout/logprob_abs_diff_mean",
        "rollout/logprob_abs_diff_max",
        "batch/zero_adv_groups",
        "timing_s/gen",
        "timing_s/old_log_prob",
        "timing_s/ref",
        "timing_s/update",
        "timing_s/step",
        "perf/tokens_per_s",
        "perf/max_memory_allocated_gb",
    ] {
        assert!(
            m[1].contains_key(key),
            "metrics lack {key}: {:?}",
            m[1].keys()
        );
    }
    assert!(
        m[2].contains_key("val/accuracy")
            && m[2].contains_key("val/pass@2")
            && m[2].contains_key("val/mean@3")
    );
    // Two mini-batches per step: each step takes two optimizer steps.
    assert_eq!(m[1]["actor/optimizer_steps"].as_f64(), Some(2.0));
    // The sampler and the trainer agree closely on a tiny f32 model.
    assert!(
        m[1]["rollout/logprob_abs_diff_max"].as_f64().unwrap() < 1e-4,
        "{:?}",
        m[1]["rollout/logprob_abs_diff_max"]
    );
    let rollouts = std::fs::read_to_string(run.join("rollouts/step_1.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(rollouts.lines().next().unwrap()).unwrap();
    for k in [
        "prompt_ids",
        "completion_ids",
        "rollout_logprobs",
        "old_logprobs",
        "advantage",
        "reward",
        "completion",
        "prompt",
    ] {
        assert!(first.get(k).is_some(), "rollout line lacks {k}");
    }
    assert_eq!(rollouts.lines().count(), 16);
    let ev: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("eval/step_2.json")).unwrap())
            .unwrap();
    assert_eq!(ev["prompts"], 4);
    assert!(ev["pass_at_k"]["pass@3"].is_number());
    // A second run into the same folder is refused.
    let cfg = tiny_config(&root, &[]);
    let e = Trainer::create(cfg, "t", &[]).err().unwrap();
    assert!(format!("{e:#}").contains("--resume"), "{e:#}");
}

/// A trainer on the tiny config with `extra` overrides in a fresh folder, scoring with `reward`.
fn trainer_with(folder: &str, extra: &[&str], reward: OfResponse) -> Trainer {
    let root = common::temp_dir(folder);
    let mut t = Trainer::create(tiny_config(&root, extra), folder, &[]).unwrap();
    t.set_reward(Box::new(reward));
    t
}

/// Every response scores 1.
const CONSTANT: OfResponse = OfResponse {
    name: "constant",
    score: |_| temper_reward::RewardOutput::new(1.0),
};

#[test]
fn all_zero_advantages_skip_the_update() {
    let mut t = trainer_with("zero", &["trainer.total_training_steps=1"], CONSTANT);
    let before = weights(&t);
    t.fit().unwrap();
    assert!(same_weights(&before, &weights(&t)));
    let m = metrics(&t);
    assert_eq!(m[0]["batch/skipped_update"].as_f64(), Some(1.0));
    assert_eq!(m[0]["batch/zero_adv_groups"].as_f64(), Some(4.0));
}

/// Panics on responses of even length; scores the others by their length.
const CRASHES: OfResponse = OfResponse {
    name: "crashes",
    score: |c| {
        if c.len().is_multiple_of(2) {
            panic!("grader exploded");
        }
        temper_reward::RewardOutput::new(c.len() as f64)
    },
};

#[test]
fn a_crashing_reward_stops_or_scores_zero_as_configured() {
    let mut t = trainer_with("crash", &["trainer.total_training_steps=1"], CRASHES);
    let e = format!("{:#}", t.fit().unwrap_err());
    assert!(
        e.contains("reward `crashes` failed")
            && e.contains("grader exploded")
            && e.contains("on_error"),
        "{e}"
    );
    assert!(!t.run().root.join("checkpoints").exists());
    let mut t = trainer_with(
        "crash-zero",
        &["trainer.total_training_steps=1", "reward.on_error=zero"],
        CRASHES,
    );
    t.fit().unwrap();
    assert!(metrics(&t)[0]["reward/errors"].as_f64().unwrap() > 0.0);
}

/// A grader that gives up on every other response (as the math grader does on a timeout or
/// unbalanced braces): reward 0, counted in `reward/errors`, the run goes on even with
/// `on_error = "fail"`, and the rollout log says why.
const GIVES_UP: OfResponse = OfResponse {
    name: "gives_up",
    score: |c| {
        if c.len().is_multiple_of(2) {
            return temper_reward::RewardOutput::failed("too_deep");
        }
        temper_reward::RewardOutput::new(c.len() as f64)
    },
};

#[test]
fn unscorable_responses_score_zero_and_are_counted() {
    let mut t = trainer_with("gives-up", &["trainer.total_training_steps=1"], GIVES_UP);
    t.fit().unwrap();
    let rollouts = std::fs::read_to_string(t.run().root.join("rollouts/step_1.jsonl")).unwrap();
    let (mut even, mut flagged) = (0, 0);
    for line in rollouts.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let even_len = v["completion"].as_str().unwrap().len().is_multiple_of(2);
        even += even_len as usize;
        if v["reward_error"] == "too_deep" {
            flagged += 1;
            assert_eq!(v["score"].as_f64(), Some(0.0));
        }
    }
    assert!(even > 0, "some responses were unscorable");
    assert_eq!(flagged, even);
    assert_eq!(metrics(&t)[0]["reward/errors"].as_f64(), Some(even as f64));
}

#[test]
fn dapo_filtering_and_off_policy_epochs_run() {
    let root = common::temp_dir("dapo");
    let cfg = tiny_config(
        &root,
        &[
            "trainer.total_training_steps=2",
            "algorithm.filter_groups.enable=true",
            "actor.ppo_epochs=3",
            "actor.clip_ratio_high=0.28",
            "actor.use_kl_loss=true",
            "actor.loss_agg_mode=seq-mean-token-sum-norm",
        ],
    );
    let mut t = Trainer::create(cfg, "d", &[]).unwrap();
    t.set_reward(Box::new(ASCII_FRACTION));
    t.fit().unwrap();
    let m = metrics(&t);
    assert_eq!(m[1]["actor/optimizer_steps"].as_f64(), Some(6.0));
    assert!(m[1].contains_key("actor/kl_loss"));
    // Later epochs are off-policy: the ratio moves away from 1.
    assert!(m[1]["actor/ppo_kl"].as_f64().unwrap() != 0.0);
}

/// One mini-batch and one epoch: the old log-probs come from the update's own first forward
/// (no extra pass), and the mismatch metrics and rollout log still get them.
#[test]
fn a_single_minibatch_reuses_the_first_forward() {
    let root = common::temp_dir("single");
    let cfg = tiny_config(
        &root,
        &[
            "trainer.total_training_steps=2",
            "actor.ppo_mini_batch_size=4",
            "trainer.check_on_policy=false",
        ],
    );
    let mut t = Trainer::create(cfg, "s", &[]).unwrap();
    t.set_reward(Box::new(ASCII_FRACTION));
    let before = weights(&t);
    t.fit().unwrap();
    assert!(!same_weights(&before, &weights(&t)));
    let m = metrics(&t);
    assert_eq!(m[0]["actor/optimizer_steps"].as_f64(), Some(1.0));
    assert_eq!(m[0]["actor/ppo_kl"].as_f64(), Some(0.0));
    assert!(m[0]["rollout/logprob_abs_diff_max"].as_f64().unwrap() < 1e-4);
    let line = std::fs::read_to_string(t.run().root.join("rollouts/step_2.jsonl")).unwrap();
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    let (old, roll) = (
        v["old_logprobs"].as_array().unwrap(),
        v["rollout_logprobs"].as_array().unwrap(),
    );
    assert_eq!(old.len(), roll.len());
    for (a, b) in old.iter().zip(roll) {
        assert!((a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-4);
    }
}

/// The GSM8K layout with the R1-Zero template, reward and stop string runs end to end (a random
/// model scores 0, so the update is skipped, and says so).
#[test]
fn gsm8k_with_r1_zero_runs() {
    let root = common::temp_dir("gsm8k");
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/gsm8k");
    let train = format!(
        "data.train_files=[{:?}]",
        data.join("test.jsonl").display().to_string()
    );
    let cfg = tiny_config(
        &root,
        &[
            "data.task=\"\"",
            &train,
            "data.prompt_key=question",
            "data.answer_key=answer",
            "data.answer_extract=gsm8k",
            "data.prompt_template=r1_zero",
            "data.max_prompt_length=512",
            "reward.name=r1_zero",
            "rollout.stop=[\"</answer>\"]",
            "trainer.total_training_steps=1",
        ],
    );
    let mut cfg = cfg;
    cfg.data.task = None;
    // Byte-level tokens make some prompts longer than 512: by default that is an error naming
    // the example...
    let mut t = Trainer::create(cfg.clone(), "g", &[]).unwrap();
    assert_eq!(t.train_data().len(), 1319);
    let e = format!("{:#}", t.fit().unwrap_err());
    assert!(
        e.contains("test.jsonl example") && e.contains("max_prompt_length"),
        "{e}"
    );
    // ...and with filter_overlong_prompts they are dropped.
    cfg.data.filter_overlong_prompts = true;
    cfg.data.max_prompt_length = 1024;
    cfg.trainer.experiment_name = "run2".into();
    let mut t = Trainer::create(cfg, "g", &[]).unwrap();
    t.fit().unwrap();
    let m = metrics(&t);
    assert_eq!(m[0]["batch/skipped_update"].as_f64(), Some(1.0));
    let line = std::fs::read_to_string(t.run().root.join("rollouts/step_1.jsonl")).unwrap();
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert!(v["prompt"].as_str().unwrap().len() > 10);
}

/// `trainer.check_on_policy` compares a separate no-grad old-logprob pass with the first update's
/// forward, also with one mini-batch and one epoch (where the update could reuse its own forward):
/// it passes as is, and fires when a weight changes between the two passes.
#[test]
fn check_on_policy_runs_a_separate_pass_and_can_fail() {
    let single = [
        "trainer.total_training_steps=1",
        "actor.ppo_mini_batch_size=4",
    ];
    for dtype in ["float32", "bfloat16"] {
        let root = common::temp_dir(&format!("on-policy-ok-{dtype}"));
        let dtype = format!("model.dtype={dtype}");
        let cfg = tiny_config(
            &root,
            &[&single[..], &[&dtype, "trainer.threads=2"]].concat(),
        );
        let mut t = Trainer::create(cfg, "s", &[]).unwrap();
        t.set_reward(Box::new(ASCII_FRACTION));
        t.fit().unwrap();
        let m = metrics(&t);
        assert_eq!(m[0]["actor/ppo_kl"].as_f64(), Some(0.0));
        assert!(m[0]["timing_s/old_log_prob"].as_f64().unwrap() > 0.0);
    }

    let root = common::temp_dir("on-policy-perturbed");
    let mut t = Trainer::create(tiny_config(&root, &single), "s", &[]).unwrap();
    t.set_reward(Box::new(ASCII_FRACTION));
    t.set_before_update(Box::new(|params| {
        tch::no_grad(|| {
            let (_, w) = params
                .iter()
                .find(|(n, _)| n.ends_with("o_proj.weight"))
                .unwrap();
            let _ = w.shallow_clone().g_add_scalar_(1e-3);
        })
    }));
    let e = format!("{:#}", t.fit().unwrap_err());
    assert!(
        e.contains("trainer.check_on_policy: step 1")
            && e.contains("differs from the old-logprob pass"),
        "{e}"
    );
}

/// DAPO's soft overlong punishment (paper eq. 13): 0 up to `L_max - L_cache` tokens, then
/// `((L_max - L_cache) - |y|) / L_cache`, reaching -1 at `L_max`; verl scales it by
/// `penalty_factor`. Checked on every logged response of a run, against the piecewise form.
#[test]
fn the_overlong_buffer_penalises_long_responses_as_dapo_defines() {
    let root = common::temp_dir("overlong");
    // L_max = data.max_response_length = 6, L_cache = 3.
    let cfg = tiny_config(
        &root,
        &[
            "reward_model.overlong_buffer.enable=True",
            "reward_model.overlong_buffer.len=3",
            "reward_model.overlong_buffer.penalty_factor=0.5",
            "reward_model.overlong_buffer.log=True",
            "trainer.total_training_steps=1",
            "algorithm.filter_groups.metric=acc",
        ],
    );
    let mut t = Trainer::create(cfg, "t", &["temper".into()]).unwrap();
    t.fit().unwrap();
    let text = std::fs::read_to_string(t.run().rollouts(1)).unwrap();
    let (l_max, l_cache, factor) = (6.0, 3.0, 0.5);
    let mut lengths = std::collections::BTreeSet::new();
    for line in text.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let len = row["completion_ids"].as_array().unwrap().len() as f64;
        lengths.insert(len as usize);
        let dapo = if len <= l_max - l_cache {
            0.0
        } else {
            ((l_max - l_cache) - len) / l_cache
        };
        let got = row["reward_metrics"]["overlong_reward"].as_f64().unwrap();
        assert!(
            (got - factor * dapo).abs() < 1e-12,
            "length {len}: {got} vs {}",
            factor * dapo
        );
        let score = row["score"].as_f64().unwrap();
        let raw = score - got;
        assert!(
            raw == 0.0 || raw == 1.0,
            "score {score} is not a 0/1 reward plus the penalty"
        );
    }
    assert!(
        lengths.iter().any(|&l| l > 3),
        "no response reached the buffer: {lengths:?}"
    );
    let m = &metrics(&t)[0];
    assert!(m["reward/overlong"].as_f64().unwrap() > 0.0, "{m:?}");
}

/// A config whose first step cannot fit this machine is refused before anything runs, naming
/// the estimate's parts and the way out, and leaves no run folder behind.
#[test]
fn a_config_that_cannot_fit_is_refused_before_it_starts() {
    let root = common::temp_dir("too-big");
    // A million-token prompt: attention alone would need terabytes.
    let cfg = tiny_config(&root, &["data.max_prompt_length=1000000"]);
    let e = format!("{:#}", Trainer::create(cfg, "big", &[]).err().unwrap());
    assert!(
        e.contains("this config needs about")
            && e.contains("attention")
            && e.contains("trainer.check_memory = false"),
        "{e}"
    );
    assert!(!root.join("run").exists(), "a refused run left its folder");
}

/// `rollout.async_steps = k` with the in-process engine: a sampler thread with its own copy of
/// the policy samples the next k steps' batches while this step trains, so step s trains on a
/// batch sampled by the policy of version max(0, s - 1 - k) (`rollout/policy_lag_max`, and the
/// versions in the rollouts files), never more than k behind; the samples are the strict loop's
/// where the weights are the same (step 1), and the run learns.
#[test]
fn in_process_overlap_keeps_the_lag_within_its_bound() {
    let strict = {
        let root = common::temp_dir("async-0");
        let cfg = tiny_config(&root, &["trainer.check_on_policy=false"]);
        let mut t = Trainer::create(cfg, "t", &[]).unwrap();
        t.set_reward(Box::new(ASCII_FRACTION));
        t.fit().unwrap();
        t.run().root.clone()
    };
    let rollouts = common::rollouts;
    for bound in [1usize, 2] {
        let root = common::temp_dir(&format!("async-{bound}"));
        let steps = format!("rollout.async_steps={bound}");
        let cfg = tiny_config(
            &root,
            &[
                steps.as_str(),
                "trainer.check_on_policy=false",
                "trainer.total_training_steps=5",
            ],
        );
        let mut t = Trainer::create(cfg, "t", &[]).unwrap();
        t.set_reward(Box::new(ASCII_FRACTION));
        let before = weights(&t);
        t.fit().unwrap();
        assert!(
            !same_weights(&before, &weights(&t)),
            "bound {bound}: trained"
        );
        let dir = t.run().root.clone();
        let lags: Vec<f64> = metrics(&t)
            .iter()
            .map(|m| m["rollout/policy_lag_max"].as_f64().unwrap())
            .collect();
        let want: Vec<f64> = (1..=5usize).map(|s| (s - 1).min(bound) as f64).collect();
        assert_eq!(lags, want, "bound {bound}");
        // From step 2 on the batch came from the sampler thread: what it cost and hid.
        for m in &metrics(&t)[1..] {
            let busy = m["async/sampler_busy_s"].as_f64().unwrap();
            let hidden = m["async/hidden_fraction"].as_f64().unwrap();
            assert!(
                busy > 0.0 && (0.0..=1.0).contains(&hidden),
                "{busy} {hidden}"
            );
            assert!(m["async/sampler_tokens_per_s"].as_f64().unwrap() > 0.0);
            // The idle shares are the waits and the busy seconds over the step's.
            let step_s = m["timing_s/step"].as_f64().unwrap();
            let wait = m["async/learner_wait_s"].as_f64().unwrap();
            let learner = m["async/learner_idle_fraction"].as_f64().unwrap();
            let sampler = m["async/sampler_idle_fraction"].as_f64().unwrap();
            assert!((learner - (wait / step_s).min(1.0)).abs() < 1e-9, "{m:?}");
            assert!(
                (sampler - (1.0 - busy / step_s).clamp(0.0, 1.0)).abs() < 1e-9,
                "{m:?}"
            );
        }
        for step in 1..=5usize {
            for r in rollouts(&dir, step) {
                let sampled_by = (step - 1).saturating_sub(bound);
                assert_eq!(
                    r["policy_version"], sampled_by as u64,
                    "bound {bound} step {step}"
                );
            }
        }
        // Step 1 is sampled by the starting weights either way: the same tokens.
        for (a, b) in rollouts(&strict, 1).iter().zip(rollouts(&dir, 1)) {
            assert_eq!(a["completion_ids"], b["completion_ids"], "bound {bound}");
        }
    }
}

/// With weights that do not change (a zero learning rate) overlap changes nothing but timing:
/// the sampler thread's copy draws every batch, with its seeds, as the strict loop does.
#[test]
fn in_process_overlap_draws_the_strict_loops_batches_when_weights_stay() {
    let run = |extra: &[&str]| {
        let root = common::temp_dir("async-same");
        let mut all = vec![
            "trainer.check_on_policy=false",
            "actor.optim.lr=0",
            "actor.optim.weight_decay=0",
        ];
        all.extend_from_slice(extra);
        let mut t = Trainer::create(tiny_config(&root, &all), "t", &[]).unwrap();
        t.set_reward(Box::new(ASCII_FRACTION));
        t.fit().unwrap();
        t.run().root.clone()
    };
    let (strict, ahead) = (run(&[]), run(&["rollout.async_steps=2"]));
    let partial = run(&["rollout.async_steps=2", "rollout.partial_rollouts=true"]);
    for step in 1..=3 {
        let read = |run| common::rollouts(run, step);
        let (a, b, c) = (read(&strict), read(&ahead), read(&partial));
        assert_eq!(a.len(), b.len());
        assert_eq!(a.len(), c.len());
        for ((x, y), z) in a.iter().zip(&b).zip(&c) {
            assert_eq!(x["completion_ids"], y["completion_ids"], "step {step}");
            assert_eq!(x["rollout_logprobs"], y["rollout_logprobs"], "step {step}");
            assert!(x["rollout_logprobs"].is_array());
            // Partial rollouts: the same draws, each token with the version that drew it.
            assert_eq!(x["completion_ids"], z["completion_ids"], "step {step}");
            assert_eq!(x["rollout_logprobs"], z["rollout_logprobs"], "step {step}");
            let versions = z["completion_versions"].as_array().unwrap();
            assert_eq!(
                versions.len(),
                z["completion_ids"].as_array().unwrap().len()
            );
            assert!(x.get("completion_versions").is_none());
        }
    }
}

/// Partial rollouts (`rollout.partial_rollouts`): new weights reach the sampler thread between
/// two tokens of the batch it samples. The lag of an answer is counted from its first token's
/// version, so it stays within the bound; each token's version lies between that and the
/// version trained on, never decreasing along the answer; each step says which share of its
/// answers spanned an update. The same with the cache recomputed after each update
/// (`rollout.recompute_kv_after_update`).
#[test]
fn partial_rollouts_keep_the_lag_within_its_bound() {
    for recompute in [false, true] {
        partial_run_keeps_the_lag_within_its_bound(recompute);
    }
}

fn partial_run_keeps_the_lag_within_its_bound(recompute: bool) {
    let root = common::temp_dir("async-partial");
    let recompute = format!("rollout.recompute_kv_after_update={recompute}");
    let cfg = tiny_config(
        &root,
        &[
            "rollout.async_steps=1",
            "rollout.partial_rollouts=true",
            recompute.as_str(),
            "trainer.check_on_policy=false",
            "trainer.total_training_steps=5",
        ],
    );
    let mut t = Trainer::create(cfg, "t", &[]).unwrap();
    t.set_reward(Box::new(ASCII_FRACTION));
    let before = weights(&t);
    t.fit().unwrap();
    assert!(!same_weights(&before, &weights(&t)));
    let dir = t.run().root.clone();
    for (i, m) in metrics(&t).iter().enumerate() {
        let step = i + 1;
        let lag = m["rollout/policy_lag_max"].as_f64().unwrap();
        assert!(lag <= 1.0 && lag <= (step - 1) as f64, "step {step}: {lag}");
        let partial = m["async/partial_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&partial), "{partial}");
        for r in common::rollouts(&dir, step) {
            checked_versions(&r, step);
        }
    }
}

/// The policy version of each token of rollout `r` (a line of `rollouts/step_<step>.jsonl` of a
/// run with partial rollouts), checked: none older than the batch's (an answer's lag counts from
/// the batch's oldest token), none decreasing along the answer, each older than the policy that
/// trains at `step`.
fn checked_versions(r: &serde_json::Value, step: usize) -> Vec<u64> {
    let first = r["policy_version"].as_u64().unwrap();
    let versions: Vec<u64> = r["completion_versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(versions.iter().all(|&v| v >= first), "{first} {versions:?}");
    assert!(versions.windows(2).all(|w| w[0] <= w[1]), "{versions:?}");
    assert!(
        versions.iter().all(|&v| v < step as u64),
        "step {step}: {versions:?}"
    );
    versions
}

/// Partial rollouts under random delays injected on the learner's side (a pause of 0 to 30 ms
/// before each update) with answers long enough (96 tokens) that the sampler thread is still
/// drawing a batch when the next weights come: answers span updates, and still no step trains
/// on a batch more than its bound behind, each token's version within it.
#[test]
fn partial_rollouts_under_random_delays_span_updates_within_the_bound() {
    let root = common::temp_dir("async-partial-delays");
    let cfg = tiny_config(
        &root,
        &[
            "rollout.async_steps=2",
            "rollout.partial_rollouts=true",
            "data.max_response_length=96",
            "rollout.min_tokens=96",
            "trainer.check_on_policy=false",
            "trainer.total_training_steps=6",
        ],
    );
    let mut t = Trainer::create(cfg, "t", &[]).unwrap();
    t.set_reward(Box::new(ASCII_FRACTION));
    t.set_before_update(common::random_delays(0x9e37_79b9_7f4a_7c15, 31));
    t.fit().unwrap();
    let dir = t.run().root.clone();
    let mut spanning = 0;
    for (i, m) in metrics(&t).iter().enumerate() {
        let step = i + 1;
        let lag = m["rollout/policy_lag_max"].as_f64().unwrap();
        assert!(lag <= 2.0, "step {step}: lag {lag}");
        for r in common::rollouts(&dir, step) {
            let versions = checked_versions(&r, step);
            assert_eq!(versions.len(), 96);
            spanning += usize::from(versions.first() != versions.last());
        }
    }
    assert!(spanning > 0, "no answer was sampled across an update");
}
