//! `temper serve`'s weight update group (SGLang's `/init_weights_update_group`,
//! `/update_weights_from_distributed`, `/destroy_weights_update_group`) driven by this test as
//! the group's rank 0, with real c10d (Gloo): a bad request is a 400 naming its field, checked
//! before anything is received; a tensor broadcast lands in the served weights (the sampled
//! tokens change, and come back when the old values are sent again); a push the server refuses
//! is given up on this side at once, its error the server's; a rendezvous that never completes
//! does not stop the serving.
use temper_testkit as common;
mod serve_util;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tch::Tensor;
use temper_kernels::Comm;

fn message(v: &Value) -> String {
    v.to_string()
}

fn greedy_tokens(server: &serve_util::Server) -> Value {
    let (status, v) = serve_util::post_json(
        server,
        "/generate",
        &json!({"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 8, "temperature": 0.0}}),
    );
    assert_eq!(status, 200, "{v}");
    v["output_ids"].clone()
}

#[test]
fn a_weight_group_checks_its_requests_and_moves_the_weights() {
    let server = serve_util::start(&common::tiny_model_dir(), &[]);
    let bad = |route: &str, body: Value, field: &str| {
        let (status, v) = serve_util::post_json(&server, route, &body);
        assert_eq!(status, 400, "{route} {body}: {v}");
        assert!(message(&v).contains(field), "{route} {body}: {v}");
    };
    let init = |port: u16| {
        json!({"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
               "world_size": 2, "group_name": "g", "backend": "gloo"})
    };
    let mut x = init(1);
    x["rank_offset"] = json!(0);
    bad("/init_weights_update_group", x, "rank_offset");
    let mut x = init(1);
    x["world_size"] = json!(1);
    bad("/init_weights_update_group", x, "world_size");
    let mut x = init(1);
    x["backend"] = json!("mpi");
    bad("/init_weights_update_group", x, "backend");
    let mut x = init(1);
    x["backend"] = json!("nccl");
    bad(
        "/init_weights_update_group",
        x,
        "nccl needs the served model on a GPU",
    );
    let mut x = init(1);
    x["color"] = json!(1);
    bad("/init_weights_update_group", x, "color");
    let update = |names: Value, dtypes: Value, shapes: Value| json!({"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": "g"});
    bad(
        "/update_weights_from_distributed",
        update(
            json!(["model.norm.weight"]),
            json!(["float32"]),
            json!([[32]]),
        ),
        "no weight update group \\\"g\\\"",
    );
    bad(
        "/update_weights_from_distributed",
        update(json!(["a", "b"]), json!(["float32"]), json!([[1], [1]])),
        "one entry per tensor",
    );
    bad(
        "/update_weights_from_distributed",
        update(json!(["a"]), json!(["int8"]), json!([[1]])),
        "dtypes[0]",
    );
    bad(
        "/update_weights_from_distributed",
        update(json!(["a"]), json!(["float32"]), json!([[-4]])),
        "shapes[0]",
    );

    let sampler =
        temper_rollout::remote::RemoteSampler::connect(temper_rollout::remote::RemoteConfig {
            protocol: temper_rollout::remote::Protocol::Sglang,
            base_urls: vec![server.url.clone()],
            timeout: Duration::from_secs(120),
            vllm_reload_method: String::new(),
            vocab_size: None,
        })
        .unwrap();
    // A group the server refuses to join (the trainer asks for NCCL, the server is on the CPU):
    // this side's rendezvous is given up at once, as the trainer's is
    // (`RemoteSampler::post_each_during`), not waited out for the group's 60 s.
    let port = common::free_port();
    let mut gave_up = None;
    let refused = sampler
        .post_each_during(
            "/init_weights_update_group",
            |_| {
                let mut x = init(port);
                x["backend"] = json!("nccl");
                x
            },
            |refused| {
                let joined = Comm::connect_unless(&common::gloo_rendezvous(port, 0, 2), refused);
                gave_up = Some(format!("{:#}", joined.err().unwrap()));
                Ok(())
            },
        )
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains("nccl needs the served model on a GPU"),
        "{refused:#}"
    );
    assert!(gave_up.unwrap().contains("gave up the rendezvous"));

    // This test is rank 0: it hosts the store and joins while the server does.
    let port = common::free_port();
    let (status, comm) = std::thread::scope(|scope| {
        let call = scope
            .spawn(|| serve_util::post_json(&server, "/init_weights_update_group", &init(port)));
        let comm = common::gloo_comm(port, 0, 2);
        let (status, v) = call.join().unwrap();
        assert_eq!(v["success"], json!(true), "{v}");
        (status, comm)
    });
    assert_eq!(status, 200);
    // Checked against the served model before anything is received.
    bad(
        "/update_weights_from_distributed",
        update(
            json!(["model.nope.weight"]),
            json!(["float32"]),
            json!([[32]]),
        ),
        "names[0]",
    );
    bad(
        "/update_weights_from_distributed",
        update(
            json!(["model.norm.weight"]),
            json!(["float32"]),
            json!([[31]]),
        ),
        "shapes[0]",
    );

    let before = greedy_tokens(&server);
    let server = &server;
    let push = |values: &Tensor| {
        std::thread::scope(|scope| {
            let body = update(
                json!(["model.norm.weight"]),
                json!(["float32"]),
                json!([[32]]),
            );
            let call = scope.spawn(move || {
                serve_util::post_json(server, "/update_weights_from_distributed", &body)
            });
            comm.broadcast(values, 0).unwrap();
            let answer = call.join();
            if answer.is_err() {
                std::thread::sleep(Duration::from_millis(500));
                panic!("the server: {:?}", server.log.lock().unwrap());
            }
            let (status, v) = answer.unwrap();
            assert_eq!((status, v["success"].clone()), (200, json!(true)), "{v}");
        })
    };
    // The final norm's weights negated (every logit negated): other tokens; then the originals back.
    let original = {
        let dir = common::tiny_model_dir();
        let m =
            temper_model::CausalLm::load(&dir, tch::Device::Cpu, temper_model::ComputeKind::F32)
                .unwrap();
        let p: std::collections::HashMap<String, Tensor> =
            m.named_parameters().into_iter().collect();
        p["model.norm.weight"].detach().copy()
    };
    let changed = (-&original).contiguous();
    push(&changed);
    let after = greedy_tokens(server);
    assert_ne!(before, after, "the pushed weights are not served");
    push(&original.contiguous());
    assert_eq!(greedy_tokens(server), before);

    // A push the server refuses (a name it does not have) arrives while this side is already in
    // the broadcast, as the trainer's does (`RemoteSampler::post_each_during`): the refusal sets
    // the flag and the broadcast is given up at once, not waited out for the group's 60 s.
    let mut given_up = None;
    let refused = sampler
        .post_each_during(
            "/update_weights_from_distributed",
            |_| {
                update(
                    json!(["model.nope.weight"]),
                    json!(["float32"]),
                    json!([[32]]),
                )
            },
            |refused| {
                given_up = Some(format!(
                    "{:?}",
                    comm.broadcast_unless(&original, 0, refused)
                ));
                Ok(())
            },
        )
        .unwrap_err();
    assert!(format!("{refused:#}").contains("names[0]"), "{refused:#}");
    assert_eq!(given_up.as_deref(), Some("Ok(false)"));
    // The group gave a collective up midway: it refuses every later one without waiting.
    let after = format!("{:#}", comm.broadcast(&original, 0).unwrap_err());
    assert!(after.contains("gave up a collective"), "{after}");
    assert_eq!(
        greedy_tokens(server),
        before,
        "the refused push changed nothing"
    );

    let (status, v) = serve_util::post_json(
        server,
        "/destroy_weights_update_group",
        &json!({"group_name": "g"}),
    );
    assert_eq!(status, 200, "{v}");
    bad(
        "/destroy_weights_update_group",
        json!({"group_name": "g"}),
        "no weight update group",
    );
}

/// A rendezvous nobody completes (rank 0 never comes) does not stop the serving.
#[test]
fn a_group_that_never_forms_does_not_stop_the_serving() {
    let timeout = std::path::Path::new("5");
    let server = serve_util::start_with_env(
        &common::tiny_model_dir(),
        &[],
        &[("TEMPER_DIST_TIMEOUT", timeout)],
    );
    let port = common::free_port();
    std::thread::scope(|scope| {
        let call = scope.spawn(|| {
            serve_util::post_json(
                &server,
                "/init_weights_update_group",
                &json!({"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
                        "world_size": 2, "backend": "gloo"}),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        greedy_tokens(&server);
        assert!(!call.is_finished(), "the join ended before its rank 0 came");
        assert!(started.elapsed() < Duration::from_secs(15));
        let (status, v) = call.join().unwrap();
        assert_eq!(status, 400, "{v}");
    });
}

/// Two servers, the first refusing the group (NCCL asked of a CPU server) while the second joins
/// it and waits in the rendezvous for rank 0: the trainer's side gives its rendezvous up and the
/// refusal is returned at once, without waiting for the second server's call, which ends only
/// when its own rendezvous gives up (a minute later here: the code before waited 61 s).
#[test]
fn one_server_refusing_the_group_is_reported_without_waiting_for_the_others() {
    let refusing = serve_util::start(&common::tiny_model_dir(), &[]);
    let joining = serve_util::start(&common::tiny_model_dir(), &[]);
    let sampler =
        temper_rollout::remote::RemoteSampler::connect(temper_rollout::remote::RemoteConfig {
            protocol: temper_rollout::remote::Protocol::Sglang,
            base_urls: vec![refusing.url.clone(), joining.url.clone()],
            timeout: Duration::from_secs(600),
            vllm_reload_method: String::new(),
            vocab_size: None,
        })
        .unwrap();
    let port = common::free_port();
    let started = Instant::now();
    let refused = sampler
        .post_each_during(
            "/init_weights_update_group",
            |k| {
                json!({"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1 + k,
                       "world_size": 3, "group_name": "g",
                       "backend": if k == 0 { "nccl" } else { "gloo" }})
            },
            |refused| {
                let joined = Comm::connect_unless(&common::gloo_rendezvous(port, 0, 3), refused);
                assert!(format!("{:#}", joined.err().unwrap()).contains("gave up the rendezvous"));
                Ok(())
            },
        )
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains("nccl needs the served model on a GPU"),
        "{refused:#}"
    );
    // Well before the joining server's rendezvous could end its call.
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(30), "waited {waited:?}");
    // The joining server still serves while its call waits.
    greedy_tokens(&joining);
}
