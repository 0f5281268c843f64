//! `temper train` with rollouts on `temper serve` processes on loopback, through each protocol
//! (`vllm`, `sglang`, `openai`): the same rollouts, token for token, and the same weights after 3
//! steps as the in-process engine, with the servers reloading the trainer's weights after every
//! step. Also: overlap (`async_steps`) and its policy lag; no weight sync and the logprob gap it
//! opens; a server killed mid-run; the served policy scoring as the trainer does; and servers
//! that are dead or answer malformed bodies.
use temper_testkit as common;
mod serve_util;

use std::path::{Path, PathBuf};

use common::{rollouts, tiny_config, weights, ASCII_FRACTION};
use serde_json::Value;
use temper_train::trainer::Trainer;

fn metrics(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|m: &Value| m["step"].as_u64().unwrap_or(0) > 0)
        .collect()
}

fn trainer(tag: &str, extra: &[&str]) -> Trainer {
    let root = common::temp_dir(tag);
    let mut args = vec!["trainer.total_training_steps=3"];
    args.extend(extra);
    let mut t = Trainer::create(tiny_config(&root, &args), "remote", &[]).unwrap();
    t.set_reward(Box::new(ASCII_FRACTION));
    t
}

fn train(tag: &str, extra: &[&str]) -> (PathBuf, Vec<(String, tch::Tensor)>) {
    let mut t = trainer(tag, extra);
    t.fit().unwrap();
    (t.run().root.clone(), weights(&t))
}

fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

fn assert_same_rollouts(a: &Path, b: &Path, steps: usize) {
    for step in 1..=steps {
        let (x, y) = (rollouts(a, step), rollouts(b, step));
        assert_eq!(x.len(), y.len());
        for (x, y) in x.iter().zip(&y) {
            assert_eq!(x["completion_ids"], y["completion_ids"], "step {step}");
            assert_eq!(x["reward"], y["reward"], "step {step}");
        }
    }
}

#[test]
fn every_protocol_gives_the_local_rollouts() {
    let server = serve_util::start(&common::tiny_model_dir(), &[]);
    let (local_run, local_w) = train("local", &[]);
    for backend in ["vllm", "sglang", "openai"] {
        // A dead server first: it is left out at connect time.
        let urls = format!("rollout.base_urls=[\"{}\", \"{}\"]", dead_url(), server.url);
        let b = format!("rollout.backend={backend:?}");
        let (run, w) = train(backend, &[&b, &urls]);
        assert_same_rollouts(&run, &local_run, 3);
        for ((n, a), (_, b)) in w.iter().zip(&local_w) {
            assert!(a.equal(b), "{backend}: {n} differs after 3 steps");
        }
        for step in 1..=3 {
            // On-policy: step k's rollouts come from the weights after k - 1 updates.
            for r in rollouts(&run, step) {
                assert_eq!(
                    r["policy_version"],
                    step as u64 - 1,
                    "{backend} step {step}"
                );
            }
        }
        let meta: Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("run_metadata.json")).unwrap())
                .unwrap();
        assert_eq!(meta["rollout_backend"]["backend"], backend);
        assert!(meta["rollout_backend"]["logprobs"].as_str().is_some());
    }
    // grail's spelling of the same.
    let root = common::temp_dir("grail");
    let url = format!("generation.base_url={:?}", server.url);
    let cfg = tiny_config(&root, &["generation.backend=\"sglang_server\"", &url]);
    assert_eq!(
        (cfg.rollout.backend.name(), cfg.rollout.base_urls.clone()),
        ("sglang", vec![server.url.clone()])
    );
}

/// `rollout.weight_sync = "distributed"`: the weights reach the servers over a Gloo group (SGLang's
/// `init_weights_update_group` / `update_weights_from_distributed`, served by `temper serve`), not
/// a folder: two servers, both protocols that have the routes, the local run's rollouts token
/// for token and its weights bitwise; no `rollout_weights/` folder; each step times the push. A
/// second trainer (the same server, a new group under the same name) works as well: a resumed
/// run forms the group anew.
#[test]
fn weights_pushed_over_a_group_give_the_local_rollouts() {
    let a = serve_util::start(&common::tiny_model_dir(), &[]);
    let b = serve_util::start(&common::tiny_model_dir(), &[]);
    let (local_run, local_w) = train("local-push", &[]);
    let urls = format!("rollout.base_urls=[{:?}, {:?}]", a.url, b.url);
    for backend in ["sglang", "openai"] {
        let be = format!("rollout.backend={backend:?}");
        let (run, w) = train(
            &format!("push-{backend}"),
            &[&be, &urls, "rollout.weight_sync=\"distributed\""],
        );
        assert_same_rollouts(&run, &local_run, 3);
        for ((n, x), (_, y)) in w.iter().zip(&local_w) {
            assert!(x.equal(y), "{backend}: {n} differs after 3 steps");
        }
        assert!(!run.join("rollout_weights").exists(), "{backend}");
        for m in metrics(&run) {
            let push = m["timing_s/weight_push"].as_f64().unwrap();
            assert!(push > 0.0, "{backend}: {m}");
        }
        for step in 1..=3 {
            for r in rollouts(&run, step) {
                assert_eq!(r["policy_version"], step as u64 - 1, "{backend}");
            }
        }
    }
    // vLLM servers have no such routes: refused before anything starts.
    let root = common::temp_dir("push-vllm");
    let e = temper_train::config::load_config(
        None,
        &common::tiny_overrides(&root)
            .into_iter()
            .chain([
                "rollout.backend=\"vllm\"".to_string(),
                urls.clone(),
                "rollout.weight_sync=\"distributed\"".to_string(),
            ])
            .collect::<Vec<_>>(),
    )
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("rollout.weight_sync = \"distributed\" needs"),
        "{e}"
    );
}

/// Two sharded ranks (`actor.strategy = fsdp`, layers gathered per use) training on one server
/// each step: rank 0 (the trainer's side of the group) pushes the weights a decoder layer at a
/// time while rank 1 gathers each layer with it, one call of SGLang's protocol per part. The
/// rollouts are the in-process sharded run's, token for token, and the weights bitwise.
#[test]
fn sharded_ranks_push_the_weights_a_layer_at_a_time() {
    let server = serve_util::start(&common::tiny_model_dir(), &[]);
    let urls = format!("rollout.base_urls=[{:?}]", server.url);
    let sharded = |tag: &str, extra: &[&str]| {
        let port = common::free_port();
        let root = common::temp_dir(tag);
        let mut args: Vec<String> = [
            "trainer.total_training_steps=3",
            "actor.strategy=fsdp",
            "actor.gradient_checkpointing=true",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        args.push(format!("trainer.experiment_name={tag:?}"));
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (root, args) = (root.clone(), args.clone());
                std::thread::spawn(move || {
                    let dist =
                        temper_train::dist::Dist::from_comm(common::gloo_comm(port, rank, 2));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let mut t =
                        Trainer::create_with(tiny_config(&root, &args), "fsdp", &[], dist).unwrap();
                    t.set_reward(Box::new(ASCII_FRACTION));
                    t.fit().unwrap();
                    (t.run().root.clone(), weights(&t))
                })
            })
            .collect();
        let mut out: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        out.swap_remove(0)
    };
    let (local, local_w) = sharded("fsdp-local", &[]);
    let (pushed, pushed_w) = sharded(
        "fsdp-push",
        &[
            "rollout.backend=\"sglang\"",
            &urls,
            "rollout.weight_sync=\"distributed\"",
        ],
    );
    assert_same_rollouts(&pushed, &local, 3);
    for ((n, x), (_, y)) in pushed_w.iter().zip(&local_w) {
        assert!(x.equal(y), "{n} differs after 3 steps");
    }
    assert!(!pushed.join("rollout_weights").exists());
    assert!(metrics(&pushed)
        .iter()
        .all(|m| m["timing_s/weight_push"].as_f64().unwrap() > 0.0));
}

#[test]
fn overlap_samples_the_next_batch_one_version_behind() {
    let server = serve_util::start(&common::tiny_model_dir(), &[]);
    let urls = format!("rollout.base_urls=[{:?}]", server.url);
    let common_args = [
        "rollout.backend=\"vllm\"",
        urls.as_str(),
        "trainer.check_on_policy=false",
        "trainer.total_training_steps=4",
    ];
    fn with<'a>(common: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        common.iter().chain(extra).copied().collect()
    }
    // With weight sync: the batch of step k (k >= 2) was sent while step k - 1 trained.
    let (run, _) = train("async1", &with(&common_args, &["rollout.async_steps=1"]));
    let m = metrics(&run);
    let lags: Vec<f64> = m
        .iter()
        .map(|m| m["rollout/policy_lag_max"].as_f64().unwrap())
        .collect();
    assert_eq!(lags, vec![0.0, 1.0, 1.0, 1.0]);
    for step in 2..=4 {
        for r in rollouts(&run, step) {
            assert_eq!(r["policy_version"], step as u64 - 2);
        }
    }
    // Without weight sync the servers never change, so overlap changes nothing but timing: the
    // batches and their seeds are the ones the strict loop draws.
    let (a, _) = train(
        "async1-nosync",
        &with(
            &common_args,
            &["rollout.async_steps=1", "rollout.weight_sync=\"none\""],
        ),
    );
    let (b, _) = train(
        "async0-nosync",
        &with(&common_args, &["rollout.weight_sync=\"none\""]),
    );
    assert_same_rollouts(&a, &b, 4);
}

#[test]
fn without_weight_sync_the_logprob_gap_grows_and_is_reported() {
    let server = serve_util::start(&common::tiny_model_dir(), &[]);
    let urls = format!("rollout.base_urls=[{:?}]", server.url);
    let (run, _) = train(
        "nosync",
        &[
            "rollout.backend=\"vllm\"",
            &urls,
            "rollout.weight_sync=\"none\"",
            "trainer.check_on_policy=false",
            "trainer.total_training_steps=4",
        ],
    );
    let m = metrics(&run);
    let gap: Vec<f64> = m
        .iter()
        .map(|m| m["rollout/logprob_abs_diff_mean"].as_f64().unwrap())
        .collect();
    let lag: Vec<f64> = m
        .iter()
        .map(|m| m["rollout/policy_lag_max"].as_f64().unwrap())
        .collect();
    assert_eq!(lag, vec![0.0, 1.0, 2.0, 3.0]);
    assert!(gap[0] < 1e-5, "step 1 is on-policy: {gap:?}");
    assert!(gap[3] > 1e-3 && gap[3] > gap[1], "the gap grows: {gap:?}");
}

#[test]
fn a_server_killed_mid_run_is_survived_by_the_other() {
    let dir = common::tiny_model_dir();
    // With weight sync the dead server fails its reload (or, pushing over a group, is found gone
    // before the push and the group formed anew without it); without, it fails rollout
    // requests, which are retried on the other. Either way the run gives what one server alone
    // gives.
    for sync in ["disk", "distributed", "none"] {
        let backend = match sync {
            "distributed" => "rollout.backend=\"sglang\"",
            _ => "rollout.backend=\"vllm\"",
        };
        let first = serve_util::start(&dir, &[]);
        let second = serve_util::start(&dir, &[]);
        let sync_arg = format!("rollout.weight_sync={sync:?}");
        let args = |urls: &str| -> Vec<String> {
            vec![
                backend.into(),
                format!("rollout.base_urls={urls}"),
                sync_arg.clone(),
                "trainer.check_on_policy=false".into(),
                "trainer.total_training_steps=4".into(),
            ]
        };
        let both = args(&format!("[{:?}, {:?}]", first.url, second.url));
        let mut t = trainer(
            &format!("killed-{sync}"),
            &both.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        // Killed during step 2, between its rollouts and its update.
        let mut victim = Some(first);
        let mut calls = 0;
        t.set_before_update(Box::new(move |_| {
            calls += 1;
            if calls == 2 {
                victim.take().unwrap().kill();
            }
        }));
        t.fit().unwrap();
        let one = args(&format!("[{:?}]", second.url));
        let (alone, _) = train(
            &format!("alone-{sync}"),
            &one.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        assert_same_rollouts(&t.run().root, &alone, 4);
    }
}

#[test]
fn the_served_policy_scores_as_the_trainer_does() {
    let server = serve_util::start(&common::tiny_model_dir(), &[]);
    let urls = format!("rollout.base_urls=[{:?}]", server.url);
    let mut t = trainer("scores", &["rollout.backend=\"vllm\"", &urls]);
    t.fit().unwrap();
    let prompt: Vec<i64> = vec![72, 105, 33, 10, 50, 43];
    let body = serde_json::json!({"prompt": prompt, "max_tokens": 8, "seed": 7, "logprobs": 0,
                                  "return_token_ids": true, "ignore_eos": true, "temperature": 1.0});
    let v: Value = reqwest::blocking::Client::new()
        .post(format!("{}/v1/completions", server.url))
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let ids: Vec<i64> = serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
    let served: Vec<f64> =
        serde_json::from_value(v["choices"][0]["logprobs"]["token_logprobs"].clone()).unwrap();
    assert_eq!(ids.len(), 8);
    // The trainer's model (after 3 updates) on prompt + completion, one forward.
    let all: Vec<i64> = prompt.iter().chain(&ids).copied().collect();
    let n = all.len() as i64;
    let input = tch::Tensor::from_slice(&all[..all.len() - 1]).view([1, n - 1]);
    let targets = tch::Tensor::from_slice(&all[1..]).view([1, n - 1]);
    let mask = tch::Tensor::ones([1, n - 1], (tch::Kind::Int64, tch::Device::Cpu));
    let pos = tch::Tensor::arange(n - 1, (tch::Kind::Int64, tch::Device::Cpu)).view([1, n - 1]);
    let (lp, _) = tch::no_grad(|| {
        t.model()
            .token_logprobs(&input, &mask, &pos, &targets, 1.0)
            .into_parts()
    });
    let mine: Vec<f64> = Vec::try_from(lp.to_kind(tch::Kind::Double).view([-1])).unwrap();
    let mine = &mine[prompt.len() - 1..];
    for (k, (a, b)) in served.iter().zip(mine).enumerate() {
        assert!((a - b).abs() < 1e-5, "token {k}: served {a}, trainer {b}");
    }
}

#[test]
fn no_server_answering_is_an_error_naming_them() {
    let dead = dead_url();
    let root = common::temp_dir("remote-dead");
    let urls = format!("rollout.base_urls=[\"{dead}\"]");
    let cfg = tiny_config(&root, &["rollout.backend=\"vllm\"", &urls]);
    let e = format!("{:#}", Trainer::create(cfg, "remote", &[]).err().unwrap());
    assert!(
        e.contains("no rollout server answered") && e.contains(&dead),
        "{e}"
    );
}
