//! `temper score --model PATH_OR_ID (--text T | --ids 1,2,3) [--chat] [--json]`: each token's
//! logprob given its prefix and the top-5 next tokens after the last one.
use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, ComputeKind};

#[derive(clap::Args)]
pub struct Args {
    /// A model folder, a hub id (ORG/NAME, from the local HF cache) or an alias (smollm2).
    #[arg(long)]
    pub model: String,
    /// Text to tokenize (with the tokenizer's special tokens, e.g. BOS, unless --chat).
    #[arg(long, conflicts_with = "ids", required_unless_present = "ids")]
    pub text: Option<String>,
    /// Comma-separated token ids, scored as given.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub ids: Option<Vec<i64>>,
    /// Wrap --text as one user message in the model's chat template (with the generation prompt).
    #[arg(long, requires = "text")]
    pub chat: bool,
    /// Print one JSON object {"ids", "token_logprobs", "top_next"}.
    #[arg(long)]
    pub json: bool,
    /// Compute dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: ComputeKind,
}

/// What `score` computes; `token_logprobs[i]` is log p(ids[i+1] | ids[..=i]).
pub struct Scores {
    pub ids: Vec<i64>,
    pub token_logprobs: Vec<f64>,
    pub top_next: Vec<(i64, f64)>,
}

/// Score `ids` under `model` (no grad).
pub fn score_ids(model: &CausalLm, ids: &[i64]) -> Result<Scores> {
    let vocab = model.config().vocab_size;
    if ids.is_empty() {
        bail!("nothing to score: no tokens");
    }
    if let Some((i, &bad)) = ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id < 0 || id >= vocab)
    {
        bail!("token id {bad} at position {i} is outside the vocabulary (0..{vocab})");
    }
    tch::no_grad(|| {
        let n = ids.len() as i64;
        let input = Tensor::from_slice(ids).view([1, n]);
        let mask = input.ones_like();
        let pos = Tensor::arange(n, (Kind::Int64, Device::Cpu)).view([1, n]);
        // The unembedding runs in chunks (no (n, V) logits); only the last position's
        // distribution is kept whole, for `top_next`.
        let hidden = model.forward_hidden(&input, &pos, &mask, None).get(0);
        let targets = input.get(0).narrow(0, 1, n - 1);
        let (picked, _) = model
            .score_tokens(
                &hidden.narrow(0, 0, n - 1),
                &targets,
                1.0,
                model.default_unembed_chunk(),
            )
            .into_parts();
        let last = model
            .logits(&hidden.narrow(0, n - 1, 1))
            .log_softmax(-1, Kind::Float)
            .get(0);
        let token_logprobs = Vec::<f64>::try_from(picked.to_kind(Kind::Double))?;
        let (vals, idx) = last.topk(5.min(vocab), -1, true, true);
        let vals = Vec::<f64>::try_from(vals.to_kind(Kind::Double))?;
        let idx = Vec::<i64>::try_from(idx)?;
        Ok(Scores {
            ids: ids.to_vec(),
            token_logprobs,
            top_next: idx.into_iter().zip(vals).collect(),
        })
    })
}

pub fn run(args: Args) -> Result<()> {
    let dir = temper_model::resolve::resolve_model(&args.model)?;
    let temper_model::Policy {
        model, tokenizer, ..
    } = temper_model::Policy::load(&dir, Device::Cpu, args.dtype)?;
    let ids = match (&args.ids, &args.text) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) => {
            let tok = tokenizer.as_ref().with_context(|| {
                format!("--text needs {}", dir.join("tokenizer.json").display())
            })?;
            tok.encode_prompt(text, args.chat)?
        }
        (None, None) => bail!("give --text or --ids"),
    };
    let s = score_ids(&model, &ids)?;
    if args.json {
        let top: Vec<serde_json::Value> = s
            .top_next
            .iter()
            .map(|(i, v)| serde_json::json!([i, v]))
            .collect();
        let out =
            serde_json::json!({"ids": s.ids, "token_logprobs": s.token_logprobs, "top_next": top});
        println!("{out}");
        return Ok(());
    }
    let show = |id: i64| -> String {
        tokenizer
            .as_ref()
            .and_then(|t| t.decode(&[id], false).ok())
            .map_or(String::new(), |t| format!("{t:?}"))
    };
    println!("ids: {:?}", s.ids);
    println!("{:>5}  {:>8}  {:>12}  token", "pos", "id", "logprob");
    for (i, &id) in s.ids.iter().enumerate() {
        let lp = if i == 0 {
            "-".to_string()
        } else {
            format!("{:.6}", s.token_logprobs[i - 1])
        };
        println!("{i:>5}  {id:>8}  {lp:>12}  {}", show(id));
    }
    let total: f64 = s.token_logprobs.iter().sum();
    println!(
        "sum of logprobs: {total:.6} over {} tokens",
        s.token_logprobs.len()
    );
    println!("top-5 next:");
    for (id, lp) in &s.top_next {
        println!("  {id:>8}  {lp:>12.6}  {}", show(*id));
    }
    Ok(())
}
