//! `temper bench serve`: decode throughput and request latency of `temper serve` under 1, 8 and 32
//! concurrent clients, and of real vLLM on CPU under the same load in the same run (where the CPU
//! has AVX-512, which vLLM's CPU kernels need). Every client sends `/v1/completions` requests one
//! after another: a distinct token-id prompt, `max_tokens` new tokens with EOS ignored (so both
//! servers make exactly as many tokens), temperature 1, a seed, the sampled tokens' logprobs (as a
//! rollout client asks). Throughput = completion tokens / wall time of the level; latency = each
//! request's round trip. `--device cuda` serves on the GPU (temper alone: the vLLM peer here is
//! vLLM's CPU build). Not a test: see BENCHMARKS.md.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::bench::{load_average, ServeChild};

#[derive(clap::Args)]
pub struct Args {
    /// A model folder, a hub id or an alias (both servers load the same folder).
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Compute dtype on both servers: auto (temper's choice for the device), f32 or bf16.
    #[arg(long, default_value = "auto")]
    pub dtype: temper_model::DtypeRequest,
    /// Where temper serve computes: cpu, cuda or cuda:N (on CUDA the vLLM CPU peer is skipped).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Most sequences temper serve decodes together (its --max-num-seqs); at least the largest
    /// --clients level so that every client's request decodes at once.
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Concurrent clients per level, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub clients: Vec<usize>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 64)]
    pub prompt_tokens: usize,
    /// New tokens per request.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Requests each client sends, one after another.
    #[arg(long, default_value_t = 2)]
    pub requests_per_client: usize,
    /// The vLLM side: auto (run it where the CPU has AVX-512), off, or on (fail without it).
    #[arg(long, default_value = "auto")]
    pub vllm: String,
    /// The vLLM-on-CPU scripts (setup.sh, serve.sh).
    #[arg(long, default_value = "../shared/tools/vllm-cpu")]
    pub vllm_tools: PathBuf,
    /// Cores vLLM's worker computes on (VLLM_CPU_OMP_THREADS_BIND): `all` (every core, as temper
    /// serve uses them), `auto` (vLLM's own choice, which keeps a core for its API server and
    /// engine processes), or a list such as `0-1`.
    #[arg(long, default_value = "all")]
    pub vllm_bind: String,
}

/// One level's measurements.
struct Level {
    clients: usize,
    tokens: usize,
    wall_s: f64,
    latencies: Vec<f64>,
}

impl Level {
    fn tok_s(&self) -> f64 {
        self.tokens as f64 / self.wall_s
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.clients.contains(&0) || args.requests_per_client == 0 || args.max_tokens == 0 {
        bail!("--clients, --requests-per-client and --max-tokens must be at least 1");
    }
    let dir = temper_model::resolve::resolve_model(&args.model).context("--model")?;
    let device = temper_base::device::parse_device_for("--device", &args.device)?;
    let compute = temper_model::resolve_compute_kind(args.dtype, device)
        .context("--dtype")?
        .compute;
    let vocab = temper_model::ModelConfig::from_file(&dir.join("config.json"))?.vocab_size;
    println!(
        "{} clients, {}-token prompts, {} new tokens each (EOS ignored), {} request(s) per \
         client, {compute}; load average before: {}",
        args.clients
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join("/"),
        args.prompt_tokens,
        args.max_tokens,
        args.requests_per_client,
        load_average()
    );
    let vllm = match args.vllm.as_str() {
        "off" => None,
        _ if device.is_cuda() => {
            println!(
                "vLLM side skipped: the peer here is vLLM's CPU build (--device {})",
                args.device
            );
            None
        }
        "on" | "auto" => match vllm_unavailable() {
            None => Some(()),
            Some(why) if args.vllm == "on" => bail!("--vllm on: {why}"),
            Some(why) => {
                println!("vLLM side skipped: {why}");
                None
            }
        },
        other => bail!("--vllm {other:?}: expected auto, on or off"),
    };

    let mut servers: Vec<(String, Vec<Level>)> = vec![];
    {
        let most = args.clients.iter().copied().max().unwrap_or(1);
        let child = ServeChild::start(&[
            "--model".into(),
            dir.display().to_string(),
            "--dtype".into(),
            compute.to_string(),
            "--device".into(),
            args.device.clone(),
            "--max-num-seqs".into(),
            args.max_num_seqs.unwrap_or(most.max(64)).to_string(),
        ])?;
        let url = child.url.clone();
        servers.push(("temper serve".into(), drive(&url, &args, vocab)?));
        println!("temper serve peak RSS: {}", child_peak_rss(&child));
    }
    if vllm.is_some() {
        let server = VllmServer::start(&args, &dir, compute)?;
        let url = format!("http://127.0.0.1:{}", server.port);
        servers.push(("vLLM 0.32 (CPU)".into(), drive(&url, &args, vocab)?));
    }

    println!("| clients | server | decode tok/s | p50 latency s | p99 latency s | temper / vLLM |");
    println!("| ---: | --- | ---: | ---: | ---: | ---: |");
    for (i, &c) in args.clients.iter().enumerate() {
        let vllm_tok_s = servers.get(1).map(|(_, l)| l[i].tok_s());
        for (name, levels) in &servers {
            let l = &levels[i];
            let ratio = match vllm_tok_s {
                Some(v) if name.starts_with("temper") => format!("{:.2}x", l.tok_s() / v),
                _ => String::new(),
            };
            println!(
                "| {c} | {name} | {:.1} | {:.2} | {:.2} | {ratio} |",
                l.tok_s(),
                percentile(&l.latencies, 0.5),
                percentile(&l.latencies, 0.99),
            );
        }
    }
    println!("load average after: {}", load_average());
    Ok(())
}

/// Why vLLM cannot run here, if it cannot.
fn vllm_unavailable() -> Option<String> {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return Some(
            "this CPU has no AVX-512, which vLLM's CPU kernels need (`import vllm._C` dies \
             with Illegal instruction)"
                .into(),
        );
    }
    None
}

/// The server's peak RSS (VmHWM), as text.
fn child_peak_rss(child: &ServeChild) -> String {
    std::fs::read_to_string(format!("/proc/{}/status", child.pid()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l["VmHWM:".len()..].trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

/// The `p`-th percentile (nearest rank).
fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// A prompt no other request shares (so a prefix cache gains nothing), spread over the vocabulary.
fn prompt(client: usize, request: usize, len: usize, vocab: i64) -> Vec<i64> {
    let salt = (client * 1009 + request * 7919) as i64;
    (0..len as i64)
        .map(|j| 100 + ((salt * 104_729 + j * 15_485_863 + j * j) % (vocab - 200)))
        .collect()
}

/// The served model's name (`/v1/models`).
fn served_name(http: &reqwest::blocking::Client, url: &str) -> Result<String> {
    let v: serde_json::Value = http.get(format!("{url}/v1/models")).send()?.json()?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("{url}/v1/models: no model id in {v}"))
}

/// One completion request; its completion token count.
fn complete(
    http: &reqwest::blocking::Client,
    url: &str,
    model: &str,
    prompt: &[i64],
    args: &Args,
    seed: i64,
) -> Result<usize> {
    let body = serde_json::json!({
        "model": model, "prompt": prompt, "max_tokens": args.max_tokens, "ignore_eos": true,
        "temperature": 1.0, "seed": seed, "logprobs": 0,
    });
    let r = http
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()?;
    let status = r.status();
    let v: serde_json::Value = r.json()?;
    if !status.is_success() {
        bail!("{url}: HTTP {status}: {v}");
    }
    let n = v["usage"]["completion_tokens"].as_u64().unwrap_or(0) as usize;
    if n != args.max_tokens {
        bail!(
            "{url}: {n} completion tokens, expected {}: {v}",
            args.max_tokens
        );
    }
    Ok(n)
}

/// Every level against the server at `url` (after one untimed warm-up request).
fn drive(url: &str, args: &Args, vocab: i64) -> Result<Vec<Level>> {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(1800))
        .build()?;
    let model = served_name(&http, url)?;
    complete(
        &http,
        url,
        &model,
        &prompt(999, 999, args.prompt_tokens, vocab),
        args,
        0,
    )
    .context("warm-up request")?;
    let mut levels = vec![];
    for &clients in &args.clients {
        let start = Instant::now();
        let results: Vec<Result<Vec<(usize, f64)>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..clients)
                .map(|c| {
                    let (http, model) = (&http, &model);
                    s.spawn(move || -> Result<Vec<(usize, f64)>> {
                        (0..args.requests_per_client)
                            .map(|r| {
                                let t = Instant::now();
                                let p = prompt(c, r, args.prompt_tokens, vocab);
                                let seed = (c * 1000 + r) as i64;
                                let n = complete(http, url, model, &p, args, seed)?;
                                Ok((n, t.elapsed().as_secs_f64()))
                            })
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| bail!("a client thread panicked"))
                })
                .collect()
        });
        let wall_s = start.elapsed().as_secs_f64();
        let mut level = Level {
            clients,
            tokens: 0,
            wall_s,
            latencies: vec![],
        };
        for r in results {
            for (n, t) in r? {
                level.tokens += n;
                level.latencies.push(t);
            }
        }
        eprintln!(
            "{url}: {} clients: {:.1} tok/s ({} tokens in {:.1} s; load average {})",
            level.clients,
            level.tok_s(),
            level.tokens,
            level.wall_s,
            load_average()
        );
        levels.push(level);
    }
    Ok(levels)
}

/// A vLLM server started by `serve.sh` (its own process group), stopped on drop.
struct VllmServer {
    pid: u32,
    port: u16,
}

impl VllmServer {
    fn start(args: &Args, dir: &Path, compute: temper_model::ComputeKind) -> Result<VllmServer> {
        let tools = &args.vllm_tools;
        run_checked(
            std::process::Command::new("bash").arg(tools.join("setup.sh")),
            Duration::from_secs(1800),
        )
        .context("setting up vLLM (setup.sh)")?;
        let port = super::launch::free_port()?;
        let dtype = match compute {
            temper_model::ComputeKind::Bf16 => "bfloat16",
            _ => "float32",
        };
        let len = (args.prompt_tokens + args.max_tokens + 16).max(1024);
        let mut cmd = std::process::Command::new("bash");
        temper_kernels::memory::without_temper_onednn_bounds(&mut cmd);
        cmd.arg(tools.join("serve.sh"))
            .arg(dir)
            .arg(port.to_string())
            .args(["--dtype", dtype])
            // vLLM 0.32 on CPU fails seeded requests whose prefill is split across steps
            // ("CPU Generator does not use offset"): room for every prompt of a level at once.
            .args(["--max-num-batched-tokens", "16384"])
            .env("VLLM_MAX_MODEL_LEN", len.to_string());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match args.vllm_bind.as_str() {
            "auto" => {}
            "all" => {
                cmd.env("VLLM_CPU_OMP_THREADS_BIND", format!("0-{}", cores - 1));
            }
            list => {
                cmd.env("VLLM_CPU_OMP_THREADS_BIND", list);
            }
        }
        let out = run_checked(&mut cmd, Duration::from_secs(900)).context("starting vLLM")?;
        let pid: u32 = out
            .trim()
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .with_context(|| format!("serve.sh printed no PID: {out:?}"))?;
        Ok(VllmServer { pid, port })
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        // SIGTERM to the process group: the API server, EngineCore and worker exit together.
        let _ = std::process::Command::new("kill")
            .args(["--", &format!("-{}", self.pid)])
            .status();
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// Runs `cmd` (no shell) to completion within `limit`; its stdout, or an error with its stderr.
fn run_checked(cmd: &mut std::process::Command, limit: Duration) -> Result<String> {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let mut stderr = child.stderr.take().context("stderr")?;
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("timed out after {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if !status.success() {
        bail!("{status}: {}", err.trim());
    }
    Ok(out)
}
