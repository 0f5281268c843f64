//! Top-k logprobs on the OpenAI and SGLang routes (vLLM's `logprobs: k` and `prompt_logprobs: k`,
//! SGLang's `top_logprobs_num`) against transformers running the same model folder:
//! `tools/serve_top_logprobs_check.py` against `temper serve` on loopback.
use temper_testkit as common;
mod serve_util;

use std::process::{Command, Stdio};

use serve_util::Client;

#[test]
fn top_logprobs_are_transformers_logprobs() {
    let server = serve_util::start(&common::tiny_model_dir(), &["--dtype", "float32"]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/serve_top_logprobs_check.py");
    let client = Client::new(
        Command::new(common::python())
            .arg(&script)
            .arg(&server.url)
            .arg(common::tiny_model_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    serve_util::passed(client);
}
