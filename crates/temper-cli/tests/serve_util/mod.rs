//! Starting `temper serve` for a test: a real process on 127.0.0.1 and a free port, stopped when
//! the handle is dropped (also when the test fails). Its client processes likewise ([`Client`]).
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

pub struct Server {
    child: Child,
    pub url: String,
    /// What the server printed on stderr after it started listening.
    #[allow(dead_code)]
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server now (SIGKILL: nothing is flushed or closed cleanly).
    #[allow(dead_code)]
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client process a test started (an SDK script), killed when dropped: a test that fails
/// before waiting for it leaves nothing running (a client of a stopped server retries forever).
/// A check script's client finished with success and printed "all checks passed" (its output
/// is shown either way).
#[allow(dead_code)]
pub fn passed(client: Client) {
    let out = client.wait_with_output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub struct Client(Option<Child>);

#[allow(dead_code)]
impl Client {
    pub fn new(child: Child) -> Client {
        Client(Some(child))
    }

    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("the client has not been waited for")
    }

    /// Waits for the client to end, with what it printed.
    pub fn wait_with_output(mut self) -> std::process::Output {
        let child = self.0.take().expect("the client has not been waited for");
        child.wait_with_output().unwrap()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `temper serve --model MODEL --port 0 [--dtype float32] EXTRA...`, once it listens.
#[allow(dead_code)]
pub fn start(model: &Path, extra: &[&str]) -> Server {
    start_with_env(model, extra, &[])
}

/// [`start`] with `env` added to the server's environment.
#[allow(dead_code)]
pub fn start_with_env(model: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_temper"))
        .envs(env.iter().copied())
        .args(["serve", "--model"])
        .arg(model)
        .args(["--port", "0"])
        // f32 as the trainer's default and the tests' engines (`auto` is bf16 on some CPUs).
        .args(if extra.contains(&"--dtype") {
            &[][..]
        } else {
            &["--dtype", "float32"][..]
        })
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("the server exited before listening")
            .unwrap();
        if let Some(addr) = line.split(" on ").nth(1) {
            break addr.trim().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    let log = Arc::new(Mutex::new(vec![]));
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    Server { child, url, log }
}

/// POST `body` as JSON to `route`: the status and the JSON answer (null when it is not JSON).
#[allow(dead_code)]
pub fn post_json(s: &Server, route: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{}{route}", s.url))
        .json(body)
        .send()
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(serde_json::Value::Null))
}

/// A forward_backward request body (protobuf, as the tinker SDK sends it) for `model_id`: one
/// cross-entropy datum, `input` with `targets` (one per input token, each weighted 1).
#[allow(dead_code)]
pub fn forward_backward_body(
    model_id: &str,
    seq_id: i32,
    input: &[i32],
    targets: &[i64],
    forward_only: bool,
) -> Vec<u8> {
    use prost::Message;
    use temper_serve::tinker::proto;
    let dense = |dtype: proto::DType, bytes: Vec<u8>, n: usize| proto::Tensor {
        encoding: Some(proto::tensor::Encoding::Dense(bytes)),
        dtype: dtype as i32,
        shape: vec![n as i64],
    };
    let bytes = |v: &[[u8; 8]]| v.concat();
    let tokens: Vec<u8> = input.iter().flat_map(|t| t.to_le_bytes()).collect();
    let target_bytes = bytes(&targets.iter().map(|t| t.to_le_bytes()).collect::<Vec<_>>());
    let weights: Vec<u8> = targets.iter().flat_map(|_| 1f32.to_le_bytes()).collect();
    proto::ForwardBackwardRequest {
        model_id: model_id.to_string(),
        seq_id,
        data: vec![proto::Datum {
            model_input: vec![proto::Chunk {
                chunk: Some(proto::chunk::Chunk::EncodedText(proto::EncodedTextChunk {
                    tokens,
                })),
            }],
            loss_fn_inputs: std::collections::HashMap::from([
                (
                    "target_tokens".to_string(),
                    dense(proto::DType::Int64, target_bytes, targets.len()),
                ),
                (
                    "weights".to_string(),
                    dense(proto::DType::Float32, weights, targets.len()),
                ),
            ]),
            ..Default::default()
        }],
        loss_fn: "cross_entropy".into(),
        forward_only,
        ..Default::default()
    }
    .encode_to_vec()
}
