//! Rollouts on inference servers: prompts go as token ids, completions come back as token ids with
//! one logprob per sampled token and a finish reason, never as re-tokenized text.
//!
//! Three protocols ([`Protocol`]): vLLM's `/v1/completions` ([`vllm`]), SGLang's `/generate`
//! ([`sglang`]), and any OpenAI-compatible server returning token ids (`openai`, the vLLM body,
//! reloaded through `temper serve`'s own `/reload_weights`). Requests spread over the servers by
//! outstanding work; a server that fails or times out is retried elsewhere, one that refuses
//! connections or fails a reload is left out from then on (with a warning), and a call fails,
//! naming every server and what it answered, only when none succeeds.

pub mod sglang;
pub mod vllm;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

pub use vllm::parse_completion;

use crate::{Finish, Request, Sample, SamplingParams};

/// One parsed sample: a finish reason a server gave (`stop` or `length`; anything else, `abort`
/// included, is an error naming `field`) and the tokens and logprobs already checked.
pub(crate) fn finished_sample(
    (index, k): (usize, usize),
    r: &Request,
    ids: Vec<i64>,
    lps: Vec<f32>,
    reason: Option<&str>,
    field: String,
) -> Result<Sample> {
    let finish = match reason {
        Some("stop") => Finish::Stop,
        Some("length") => Finish::Length,
        other => bail!("{field} is {other:?} (the request was not finished)"),
    };
    Ok(Sample {
        request_index: index,
        sample_index: k,
        prompt_ids: r.prompt_ids.clone(),
        completion_ids: ids,
        completion_logprobs: lps,
        finish,
        stop_reason: None,
        completion_versions: vec![],
    })
}

/// Which API the servers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `/v1/completions`; reload: `/collective_rpc` (dev mode) + `/reset_prefix_cache`.
    Vllm,
    /// `/generate`; reload: `/update_weights_from_disk` + `/flush_cache`.
    Sglang,
    /// `/v1/completions`; reload: temper's `/reload_weights`.
    OpenAi,
}

impl std::str::FromStr for Protocol {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "vllm" => Protocol::Vllm,
            "sglang" => Protocol::Sglang,
            "openai" => Protocol::OpenAi,
            _ => bail!("{s:?}: expected vllm, sglang or openai"),
        })
    }
}

/// How to reach the servers.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    pub protocol: Protocol,
    pub base_urls: Vec<String>,
    /// Bounds every request; a request that takes longer is retried on another server.
    pub timeout: Duration,
    /// The `collective_rpc` method a vLLM server reloads weights with (`reload_weights`, or the
    /// name a worker extension registers).
    pub vllm_reload_method: String,
    /// The trainer's vocabulary: a sampled id outside it means the server runs another model.
    pub vocab_size: Option<i64>,
}

struct Server {
    url: String,
    outstanding: AtomicUsize,
    alive: AtomicBool,
}

/// A client for one or more servers serving the same model.
pub struct RemoteSampler {
    /// Shared with the threads of [`RemoteSampler::post_each_during`], which may outlive a call
    /// that gave up on them.
    servers: Vec<Arc<Server>>,
    model_name: String,
    cfg: RemoteConfig,
    client: reqwest::blocking::Client,
}

impl RemoteSampler {
    /// Ask each server for its model (`/v1/models`, or SGLang's `/get_model_info`); servers that
    /// do not answer are left out, and it is an error when none answers.
    pub fn connect(cfg: RemoteConfig) -> Result<RemoteSampler> {
        if cfg.base_urls.is_empty() {
            bail!("rollout.base_urls is empty");
        }
        let client = reqwest::blocking::Client::builder()
            .timeout(cfg.timeout)
            .build()?;
        let (mut servers, mut names, mut failures) = (vec![], vec![], vec![]);
        for url in &cfg.base_urls {
            let url = url.trim_end_matches('/').to_string();
            match served_model(&client, &url, cfg.protocol) {
                Ok(name) => {
                    names.push(name);
                    servers.push(Arc::new(Server {
                        url,
                        outstanding: AtomicUsize::new(0),
                        alive: AtomicBool::new(true),
                    }));
                }
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        if servers.is_empty() {
            bail!("no rollout server answered: {}", failures.join("; "));
        }
        for f in &failures {
            eprintln!("warning: rollout server left out: {f}");
        }
        if names.iter().any(|n| n != &names[0]) {
            bail!("the rollout servers serve different models: {names:?}");
        }
        Ok(RemoteSampler {
            servers,
            model_name: names.remove(0),
            cfg,
            client,
        })
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    pub fn protocol(&self) -> Protocol {
        self.cfg.protocol
    }

    /// The servers still in use.
    pub fn live_urls(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter(|s| s.alive.load(Ordering::Relaxed))
            .map(|s| s.url.clone())
            .collect()
    }

    /// Every request's samples (in request order, then sample order), the requests sent
    /// concurrently.
    pub fn generate(&self, requests: &[Request]) -> Result<Vec<Sample>> {
        let results: Vec<Result<Vec<Sample>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = requests
                .iter()
                .enumerate()
                .map(|(i, r)| scope.spawn(move || self.one(i, r)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| bail!("a rollout request thread panicked"))
                })
                .collect()
        });
        let mut out = vec![];
        for r in results {
            out.extend(r?);
        }
        Ok(out)
    }

    /// One request, on the least busy live server first, then on the others.
    fn one(&self, index: usize, request: &Request) -> Result<Vec<Sample>> {
        let mut order: Vec<&Server> = self
            .servers
            .iter()
            .map(Arc::as_ref)
            .filter(|s| s.alive.load(Ordering::Relaxed))
            .collect();
        order.sort_by_key(|s| s.outstanding.load(Ordering::Relaxed));
        check_for_server(self.cfg.protocol, &request.params)
            .with_context(|| format!("rollout request {index}"))?;
        let (route, body) = match self.cfg.protocol {
            Protocol::Sglang => ("/generate", sglang::generate_body(request)),
            Protocol::Vllm | Protocol::OpenAi => (
                "/v1/completions",
                vllm::completion_body(&self.model_name, request),
            ),
        };
        let mut failures = vec![];
        for server in order {
            let n = request.params.n;
            server.outstanding.fetch_add(n, Ordering::Relaxed);
            let answer = self.post(server, route, &body);
            server.outstanding.fetch_sub(n, Ordering::Relaxed);
            let parsed = answer.and_then(|v| {
                let samples = match self.cfg.protocol {
                    Protocol::Sglang => sglang::parse_generate(&v, index, request, &server.url),
                    _ => vllm::parse_completion(&v, index, request, &server.url),
                }?;
                self.check_vocab(&samples, &server.url)?;
                Ok(samples)
            });
            match parsed {
                Ok(samples) => return Ok(samples),
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        if failures.is_empty() {
            bail!("rollout request {index}: no rollout server is left");
        }
        bail!(
            "rollout request {index}: every server failed: {}",
            failures.join("; ")
        )
    }

    fn check_vocab(&self, samples: &[Sample], url: &str) -> Result<()> {
        let Some(v) = self.cfg.vocab_size else {
            return Ok(());
        };
        for s in samples {
            if let Some(id) = s.completion_ids.iter().find(|&&id| id < 0 || id >= v) {
                bail!(
                    "{url}: sample {} has token id {id}, outside the trainer's vocabulary of {v} (does the \
                     server run another model?)",
                    s.sample_index
                );
            }
        }
        Ok(())
    }

    /// POST `body` to `server` + `route`; an HTTP error is an error with the server's message. A
    /// refused connection leaves the server out from then on.
    fn post(&self, server: &Server, route: &str, body: &Value) -> Result<Value> {
        post(&self.client, server, route, body)
    }

    /// Ask every live server to load the weights in `dir` (an HF folder written atomically).
    /// `version` is the trainer's policy version (SGLang records it as `weight_version`). A server
    /// that fails is left out from then on: it would serve stale weights. An error when none
    /// reloads.
    pub fn reload(&self, dir: &Path, version: u64) -> Result<()> {
        let dir = dir
            .canonicalize()
            .with_context(|| format!("{}", dir.display()))?;
        let calls: Vec<(&str, Value)> = match self.cfg.protocol {
            Protocol::Vllm => vec![
                (
                    "/collective_rpc",
                    json!({"method": self.cfg.vllm_reload_method, "kwargs": {"weights_path": dir}}),
                ),
                ("/reset_prefix_cache", json!({})),
            ],
            Protocol::Sglang => vec![
                (
                    "/update_weights_from_disk",
                    json!({"model_path": dir, "weight_version": version.to_string()}),
                ),
                ("/flush_cache", json!({})),
            ],
            Protocol::OpenAi => vec![("/reload_weights", json!({"weights_path": dir}))],
        };
        let mut failures = vec![];
        for s in self
            .servers
            .iter()
            .filter(|s| s.alive.load(Ordering::Relaxed))
        {
            let result = calls.iter().try_for_each(|(route, body)| {
                let v = self.post(s, route, body)?;
                if v["success"] == json!(false) {
                    bail!("{}{route}: {}", s.url, error_message(&v));
                }
                Ok(())
            });
            if let Err(e) = result {
                s.alive.store(false, Ordering::Relaxed);
                eprintln!(
                    "warning: rollout server {} failed to reload weights; leaving it out: {e:#}",
                    s.url
                );
                failures.push(format!("{e:#}"));
            }
        }
        if self.live_urls().is_empty() {
            bail!(
                "no rollout server reloaded the weights: {}",
                failures.join("; ")
            );
        }
        Ok(())
    }
}

impl RemoteSampler {
    /// Asks every live server for `/health`; those that cannot be reached are left out from now
    /// on (said once each), as a failed request leaves them out. Before a collective with the
    /// servers: a member that is gone would make it wait for its timeout.
    pub fn check_alive(&self) {
        for s in self
            .servers
            .iter()
            .filter(|s| s.alive.load(Ordering::Relaxed))
        {
            let answered = self
                .client
                .get(format!("{}/health", s.url))
                .timeout(Duration::from_secs(10))
                .send();
            if let Err(e) = answered {
                if (e.is_connect() || e.is_timeout()) && s.alive.swap(false, Ordering::Relaxed) {
                    eprintln!(
                        "warning: rollout server {} does not answer; leaving it out",
                        s.url
                    );
                }
            }
        }
    }

    /// Each live server's answer to `GET route` (in `live_urls` order), `None` where it has no
    /// such route or does not answer with JSON (SGLang's `/get_server_info` says how many ranks a
    /// server has; `temper serve` has no such route: one rank).
    pub fn get_each(&self, route: &str) -> Vec<Option<Value>> {
        self.servers
            .iter()
            .filter(|s| s.alive.load(Ordering::Relaxed))
            .map(|s| {
                self.client
                    .get(format!("{}{route}", s.url))
                    .send()
                    .and_then(|r| r.error_for_status())
                    .and_then(|r| r.json::<Value>())
                    .ok()
            })
            .collect()
    }

    /// Posts `body(k)` to `route` of the k-th live server, all at once, while `during` runs on
    /// this thread (the calls that answer only once a collective has run on both sides: SGLang's
    /// `/init_weights_update_group` and `/update_weights_from_distributed`). Only the SGLang
    /// protocol and `temper serve` have these routes; an error names the server that failed.
    /// `during` is handed a flag set as soon as a call fails (a server refused, or stopped
    /// answering): its side of the collective can give up instead of waiting out the timeout.
    /// After a failure the other servers' calls are not waited for (they wait in the collective
    /// the failure broke, until their own timeout): the failure is returned at once, and their
    /// threads end when their calls do.
    pub fn post_each_during<T>(
        &self,
        route: &str,
        body: impl Fn(usize) -> Value,
        during: impl FnOnce(&AtomicBool) -> Result<T>,
    ) -> Result<T> {
        if self.cfg.protocol == Protocol::Vllm {
            bail!("{route}: vLLM servers reload weights from disk only (rollout.weight_sync = \"disk\")");
        }
        let live: Vec<Arc<Server>> = self
            .servers
            .iter()
            .filter(|s| s.alive.load(Ordering::Relaxed))
            .cloned()
            .collect();
        let failed = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Result<()>>();
        for (k, server) in live.iter().enumerate() {
            let (body, path, server) = (body(k), route.to_string(), server.clone());
            let (sender, flag, client) = (tx.clone(), failed.clone(), self.client.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("post{route}"))
                .spawn(move || {
                    let answered = post(&client, &server, &path, &body).and_then(|v| {
                        if v["success"] == json!(false) {
                            bail!("{}{path}: {}", server.url, error_message(&v));
                        }
                        Ok(())
                    });
                    if answered.is_err() {
                        flag.store(true, Ordering::SeqCst);
                    }
                    // The receiver is gone when an earlier failure was returned already.
                    let _ = sender.send(answered);
                });
            if let Err(e) = spawned {
                failed.store(true, Ordering::SeqCst);
                let _ = tx.send(Err(
                    anyhow::Error::new(e).context(format!("{route}: a thread"))
                ));
            }
        }
        drop(tx);
        let ran = during(&failed);
        // The server's own message says more than the collective's timeout.
        for _ in 0..live.len() {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => bail!("{route}: a call ended without an answer"),
            }
        }
        ran
    }
}

/// POST `body` to `server` + `route` with `client` (a handle on the sampler's connection pool, so
/// that a thread can post on its own); see [`RemoteSampler::post`].
fn post(
    client: &reqwest::blocking::Client,
    server: &Server,
    route: &str,
    body: &Value,
) -> Result<Value> {
    let url = format!("{}{route}", server.url);
    let r = match client.post(&url).json(body).send() {
        Ok(r) => r,
        Err(e) => {
            if e.is_connect() && server.alive.swap(false, Ordering::Relaxed) {
                eprintln!(
                    "warning: rollout server {} does not answer; leaving it out",
                    server.url
                );
            }
            return Err(anyhow::Error::new(e).context(url));
        }
    };
    let status = r.status();
    let text = r.text().with_context(|| url.clone())?;
    // vLLM's `/reset_prefix_cache` answers 200 with an empty body.
    if status.is_success() && text.trim().is_empty() {
        return Ok(Value::Null);
    }
    let v: Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{url}: the answer is not JSON (HTTP {status}): {}",
            snippet(&text)
        )
    })?;
    if !status.is_success() {
        bail!("{url}: HTTP {status}: {}", error_message(&v));
    }
    Ok(v)
}

/// The model a server serves.
fn served_model(
    client: &reqwest::blocking::Client,
    url: &str,
    protocol: Protocol,
) -> Result<String> {
    let get = |route: &str| -> Result<Value> {
        client
            .get(format!("{url}{route}"))
            .send()
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.json::<Value>())
            .with_context(|| format!("{url}{route}"))
    };
    match get("/v1/models") {
        Ok(v) => v["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("{url}/v1/models lists no model")),
        Err(e) if protocol == Protocol::Sglang => get("/get_model_info")
            .ok()
            .and_then(|v| v["model_path"].as_str().map(str::to_string))
            .ok_or(e),
        Err(e) => Err(e),
    }
}

/// The message of an error body (vLLM `{"message"}` or `{"error": {"message"}}`, SGLang
/// `{"error": {"message"}}` or `{"message"}`, temper `{"error": "..."}`).
fn error_message(v: &Value) -> String {
    v["message"]
        .as_str()
        .or(v["error"]["message"].as_str())
        .or(v["error"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| snippet(&v.to_string()))
}

fn snippet(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// What a server refuses that temper's own engine samples: checked before a request is sent (and
/// by the trainer's config checks), so that a run fails at once naming the field, not at its
/// first rollout with the server's 400. The bounds are the servers' own (vLLM's `SamplingParams`
/// and `StopParam`, SGLang's `SamplingParams.verify`; transcribed with their sources in
/// tests/fixtures/server_request_schemas.json, which tests/remote_request_schemas.rs holds the
/// request bodies to). `temper serve` (`openai`) takes what the engine takes.
pub fn check_for_server(protocol: Protocol, p: &SamplingParams) -> Result<()> {
    match protocol {
        Protocol::Vllm => {
            if p.temperature > 2.0 {
                bail!("temperature = {}: vLLM accepts at most 2.0", p.temperature);
            }
            if p.temperature == 0.0 && p.n > 1 {
                bail!(
                    "n = {} with temperature = 0: vLLM refuses more than one greedy sample \
                     (they would all be the same)",
                    p.n
                );
            }
            if p.stop.len() > VLLM_MAX_STOP_STRINGS {
                bail!(
                    "stop: {} strings; vLLM accepts at most {VLLM_MAX_STOP_STRINGS}",
                    p.stop.len()
                );
            }
            if p.stop.iter().any(String::is_empty) {
                bail!("stop: an empty string, which vLLM refuses");
            }
        }
        Protocol::Sglang => {
            if p.repetition_penalty > 2.0 {
                bail!(
                    "repetition_penalty = {}: SGLang accepts (0, 2]",
                    p.repetition_penalty
                );
            }
        }
        Protocol::OpenAi => {}
    }
    Ok(())
}

/// vLLM's default `VLLM_MAX_STOP_STRINGS`.
const VLLM_MAX_STOP_STRINGS: usize = 4;

/// `top_k` as the servers take it: temper's "off" is -1 or 0; SGLang refuses 0 (off is -1 there,
/// and in vLLM).
pub(crate) fn wire_top_k(top_k: i64) -> i64 {
    if top_k <= 0 {
        -1
    } else {
        top_k
    }
}

/// A request's seed as the servers accept it: vLLM's `seed` and SGLang's `sampling_seed` are
/// signed 64-bit integers (both answer 400 outside [-2^63, 2^63 - 1]; vLLM 0.33's
/// protocol.py, SGLang 0.5.23's sampling_params.py), so temper's u64 seed is sent as the i64
/// with the same bits. `temper serve` reads it back to the same u64, so a seeded request draws
/// the same tokens on it as in process. (vLLM reads -1, which is u64::MAX, as unseeded.)
pub(crate) fn wire_seed(seed: Option<u64>) -> Option<i64> {
    seed.map(|s| s as i64)
}

#[cfg(test)]
mod seed_tests {
    use super::wire_seed;

    #[test]
    fn seeds_fit_a_signed_64_bit_integer() {
        assert_eq!(wire_seed(None), None);
        assert_eq!(wire_seed(Some(7)), Some(7));
        assert_eq!(wire_seed(Some(u64::MAX)), Some(-1));
        assert_eq!(wire_seed(Some(1 << 63)), Some(i64::MIN));
        assert_eq!(
            wire_seed(Some(u64::MAX - 1)).map(|s| s as u64),
            Some(u64::MAX - 1)
        );
        let body = super::vllm::completion_body(
            "m",
            &crate::Request {
                prompt_ids: vec![1],
                params: crate::SamplingParams {
                    seed: Some(u64::MAX - 1),
                    ..Default::default()
                },
            },
        );
        assert_eq!(body["seed"].as_i64(), Some(-2));
    }
}
