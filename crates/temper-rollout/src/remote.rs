//! Rollouts on inference servers that speak vLLM's OpenAI-compatible `/v1/completions` (vLLM,
//! `temper serve`): prompts go as token ids, completions come back as token ids with one logprob
//! per sampled token and a finish reason, never as re-tokenized text. Requests spread over the
//! servers by outstanding work; a server that fails or times out is retried elsewhere, and the
//! call fails, naming every server and what it answered, only when none succeeds.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::{Finish, Request, Sample};

struct Server {
    url: String,
    outstanding: AtomicUsize,
}

/// A client for one or more vLLM-compatible servers serving the same model.
pub struct RemoteSampler {
    servers: Vec<Server>,
    model_name: String,
    client: reqwest::blocking::Client,
}

impl RemoteSampler {
    /// Ask each server for its model (`/v1/models`); servers that do not answer are left out, and
    /// it is an error when none answers. `timeout` bounds every request.
    pub fn connect(base_urls: &[String], timeout: Duration) -> Result<RemoteSampler> {
        if base_urls.is_empty() {
            bail!("rollout.base_urls is empty");
        }
        let client = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .build()?;
        let (mut servers, mut names, mut failures) = (vec![], vec![], vec![]);
        for url in base_urls {
            let url = url.trim_end_matches('/').to_string();
            let answer = client
                .get(format!("{url}/v1/models"))
                .send()
                .and_then(|r| r.error_for_status())
                .and_then(|r| r.json::<Value>());
            match answer {
                Ok(v) => match v["data"][0]["id"].as_str() {
                    Some(id) => {
                        names.push(id.to_string());
                        servers.push(Server {
                            url,
                            outstanding: AtomicUsize::new(0),
                        });
                    }
                    None => failures.push(format!("{url}: /v1/models lists no model")),
                },
                Err(e) => failures.push(format!("{url}: {e}")),
            }
        }
        if servers.is_empty() {
            bail!("no rollout server answered: {}", failures.join("; "));
        }
        if names.iter().any(|n| n != &names[0]) {
            bail!("the rollout servers serve different models: {names:?}");
        }
        Ok(RemoteSampler {
            servers,
            model_name: names.remove(0),
            client,
        })
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
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

    /// One request, on the least busy server first, then on the others.
    fn one(&self, index: usize, request: &Request) -> Result<Vec<Sample>> {
        let mut order: Vec<&Server> = self.servers.iter().collect();
        order.sort_by_key(|s| s.outstanding.load(Ordering::Relaxed));
        let body = self.body(request);
        let mut failures = vec![];
        for server in order {
            server
                .outstanding
                .fetch_add(request.params.n, Ordering::Relaxed);
            let answer = self.post(server, &body);
            server
                .outstanding
                .fetch_sub(request.params.n, Ordering::Relaxed);
            match answer.and_then(|v| parse_completion(&v, index, request, &server.url)) {
                Ok(samples) => return Ok(samples),
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        bail!(
            "rollout request {index}: every server failed: {}",
            failures.join("; ")
        )
    }

    fn post(&self, server: &Server, body: &Value) -> Result<Value> {
        let r = self
            .client
            .post(format!("{}/v1/completions", server.url))
            .json(body)
            .send()
            .with_context(|| server.url.clone())?;
        let status = r.status();
        let v: Value = r
            .json()
            .with_context(|| format!("{}: the answer is not JSON (HTTP {status})", server.url))?;
        if !status.is_success() {
            let msg = v["message"].as_str().or(v["error"]["message"].as_str());
            bail!(
                "{}: HTTP {status}: {}",
                server.url,
                msg.unwrap_or("no message")
            );
        }
        Ok(v)
    }

    /// vLLM's request for one temper [`Request`].
    fn body(&self, r: &Request) -> Value {
        let p = &r.params;
        json!({
            "model": self.model_name, "prompt": r.prompt_ids, "n": p.n, "max_tokens": p.max_tokens,
            "min_tokens": p.min_tokens, "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
            "repetition_penalty": p.repetition_penalty, "seed": p.seed, "stop": p.stop,
            "stop_token_ids": p.stop_token_ids, "ignore_eos": p.ignore_eos, "logprobs": 0,
            "return_token_ids": true, "include_stop_str_in_output": true, "skip_special_tokens": false,
        })
    }

    /// Ask every server to load the weights in `dir` (vLLM's dev-mode `reload_weights`, then
    /// `reset_prefix_cache` so cached prefixes do not keep the old weights' keys and values).
    pub fn reload(&self, dir: &Path) -> Result<()> {
        let dir = dir
            .canonicalize()
            .with_context(|| format!("{}", dir.display()))?;
        for s in &self.servers {
            let rpc = json!({"method": "reload_weights", "kwargs": {"weights_path": dir}});
            for (route, body) in [("/collective_rpc", rpc), ("/reset_prefix_cache", json!({}))] {
                let r = self
                    .client
                    .post(format!("{}{route}", s.url))
                    .json(&body)
                    .send()
                    .with_context(|| format!("{}{route}", s.url))?;
                if !r.status().is_success() {
                    let status = r.status();
                    let text = r.text().unwrap_or_default();
                    bail!("{}{route}: HTTP {status}: {}", s.url, text.trim());
                }
            }
        }
        Ok(())
    }
}

/// The samples of one `/v1/completions` answer, checked: token ids present, one logprob per token,
/// a known finish reason.
pub fn parse_completion(v: &Value, index: usize, r: &Request, url: &str) -> Result<Vec<Sample>> {
    let Some(choices) = v["choices"].as_array() else {
        bail!("{url}: the answer has no `choices`");
    };
    if choices.len() != r.params.n {
        bail!("{url}: {} choices for n = {}", choices.len(), r.params.n);
    }
    choices
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let field = |name: &str| format!("{url}: choices[{k}].{name}");
            let ids: Vec<i64> =
                serde_json::from_value(c["token_ids"].clone()).with_context(|| {
                    format!(
                        "{} is missing or not token ids (the server must support return_token_ids)",
                        field("token_ids")
                    )
                })?;
            let lps: Vec<f32> = serde_json::from_value(c["logprobs"]["token_logprobs"].clone())
                .with_context(|| {
                    format!(
                        "{} is missing or not numbers",
                        field("logprobs.token_logprobs")
                    )
                })?;
            if lps.len() != ids.len() {
                bail!(
                    "{} has {} values for {} tokens",
                    field("logprobs.token_logprobs"),
                    lps.len(),
                    ids.len()
                );
            }
            let finish = match c["finish_reason"].as_str() {
                Some("stop") => Finish::Stop,
                Some("length") => Finish::Length,
                other => bail!(
                    "{} is {other:?} (the request was not finished)",
                    field("finish_reason")
                ),
            };
            Ok(Sample {
                request_index: index,
                sample_index: k,
                prompt_ids: r.prompt_ids.clone(),
                completion_ids: ids,
                completion_logprobs: lps,
                finish,
                stop_reason: None,
            })
        })
        .collect()
}
