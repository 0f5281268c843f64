//! SGLang's native `POST /generate`, as slime and grail call it: `input_ids`, `sampling_params`,
//! `return_logprob: true`. Each sample answers `{"output_ids", "meta_info": {"finish_reason":
//! {"type"}, "output_token_logprobs": [[logprob, token_id, text], ...]}}`, a list when `n > 1`.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::{Request, Sample};

/// The body of one request. `no_stop_trim` keeps the stop token in `output_ids`, as temper's
/// engine and vLLM do.
pub fn generate_body(r: &Request) -> Value {
    let p = &r.params;
    json!({
        "input_ids": r.prompt_ids,
        "sampling_params": {
            "n": p.n, "max_new_tokens": p.max_tokens, "min_new_tokens": p.min_tokens,
            "temperature": p.temperature, "top_p": p.top_p, "top_k": super::wire_top_k(p.top_k),
            "repetition_penalty": p.repetition_penalty, "stop": p.stop,
            "stop_token_ids": p.stop_token_ids, "ignore_eos": p.ignore_eos,
            "sampling_seed": super::wire_seed(p.seed), "skip_special_tokens": false, "no_stop_trim": true,
        },
        "return_logprob": true,
    })
}

/// The samples of one `/generate` answer, checked: `output_ids` present, one logprob per token
/// whose id matches it, a known finish reason.
pub fn parse_generate(v: &Value, index: usize, r: &Request, url: &str) -> Result<Vec<Sample>> {
    let answers: Vec<&Value> = match v {
        Value::Array(list) => list.iter().collect(),
        Value::Object(_) if v.get("output_ids").is_some() || v.get("meta_info").is_some() => {
            vec![v]
        }
        _ => bail!("{url}: the answer is neither a sample nor a list of samples"),
    };
    if answers.len() != r.params.n {
        bail!("{url}: {} samples for n = {}", answers.len(), r.params.n);
    }
    answers
        .iter()
        .enumerate()
        .map(|(k, a)| {
            let field = |name: &str| format!("{url}: [{k}].{name}");
            let ids: Vec<i64> = serde_json::from_value(a["output_ids"].clone())
                .with_context(|| format!("{} is missing or not token ids", field("output_ids")))?;
            let entries = a["meta_info"]["output_token_logprobs"]
                .as_array()
                .with_context(|| {
                    format!(
                        "{} is missing (the request must set return_logprob)",
                        field("meta_info.output_token_logprobs")
                    )
                })?;
            if entries.len() != ids.len() {
                bail!(
                    "{} has {} entries for {} tokens",
                    field("meta_info.output_token_logprobs"),
                    entries.len(),
                    ids.len()
                );
            }
            let mut lps = Vec::with_capacity(ids.len());
            for (t, (e, id)) in entries.iter().zip(&ids).enumerate() {
                let lp = e[0].as_f64().with_context(|| {
                    format!(
                        "{}[{t}][0] is not a number",
                        field("meta_info.output_token_logprobs")
                    )
                })?;
                if e[1].as_i64() != Some(*id) {
                    bail!(
                        "{}[{t}] is for token {}, output_ids has {id}",
                        field("meta_info.output_token_logprobs"),
                        e[1]
                    );
                }
                lps.push(lp as f32);
            }
            super::finished_sample(
                (index, k),
                r,
                ids,
                lps,
                a["meta_info"]["finish_reason"]["type"].as_str(),
                field("meta_info.finish_reason.type"),
            )
        })
        .collect()
}
