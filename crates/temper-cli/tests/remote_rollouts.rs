//! `rollout.backend = "vllm"` against a `temper serve` process on loopback: the same rollouts,
//! token for token, and the same weights after 3 steps as the in-process engine, with the server
//! reloading the trainer's weights after every step (`rollout.weight_sync = "disk"`). A dead
//! server among the base URLs is left out; none answering is an error naming them.
#[path = "../../temper-train/tests/common/mod.rs"]
mod common;
mod serve_util;

use std::path::Path;

use common::{tiny_config, AsciiFraction};
use temper_train::trainer::Trainer;

fn rollouts(run: &Path, step: usize) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join(format!("rollouts/step_{step}.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn train(tag: &str, extra: &[&str]) -> (std::path::PathBuf, Vec<(String, tch::Tensor)>) {
    let root = common::temp_dir(tag);
    let mut args = vec!["trainer.total_training_steps=3"];
    args.extend(extra);
    let mut t = Trainer::create(tiny_config(&root, &args), "remote", &[]).unwrap();
    t.reward = Box::new(AsciiFraction);
    t.fit().unwrap();
    let w = t
        .model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.detach().copy()))
        .collect();
    (t.run.root.clone(), w)
}

#[test]
fn served_rollouts_equal_local_ones() {
    let server = serve_util::start(&common::tiny_model_dir(), &[]);
    let url = server.url.clone();
    // A dead server first: it is left out at connect time.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let urls = format!("rollout.base_urls=[\"{dead}\", \"{url}\"]");
    let (remote_run, remote_w) = train("remote", &["rollout.backend=\"vllm\"", &urls]);
    let (local_run, local_w) = train("local", &[]);
    for step in 1..=3 {
        let (a, b) = (rollouts(&remote_run, step), rollouts(&local_run, step));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x["completion_ids"], y["completion_ids"], "step {step}");
            assert_eq!(x["reward"], y["reward"], "step {step}");
        }
    }
    for ((n, a), (_, b)) in remote_w.iter().zip(&local_w) {
        assert!(a.equal(b), "{n} differs after 3 steps");
    }
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(remote_run.join("run_metadata.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["rollout_backend"]["backend"], "vllm");
}

#[test]
fn no_server_answering_is_an_error_naming_them() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let root = common::temp_dir("remote-dead");
    let urls = format!("rollout.base_urls=[\"{dead}\"]");
    let cfg = tiny_config(&root, &["rollout.backend=\"vllm\"", &urls]);
    let e = format!("{:#}", Trainer::create(cfg, "remote", &[]).err().unwrap());
    assert!(
        e.contains("no rollout server answered") && e.contains(&dead),
        "{e}"
    );
}
