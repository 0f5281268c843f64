//! One forward pass over a prompt and what a sample request may ask of it at every position after
//! the first: the top-k next tokens (`prompt_topk.rs`), the logprobs of given token ids (Tinker's
//! `target_prompt_logprobs`) and independent draws from the next-token distribution (Tinker's
//! `prompt_alt_tokens_k`).

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};
use temper_base::seed::mix;
use temper_model::{position_ids_from_mask, CausalLm};

/// Positions whose logits are computed at once: a (chunk x vocabulary) f32 block, 50 MB for
/// SmolLM2's 49,152 tokens.
const CHUNK: i64 = 256;

/// Every prompt id inside `model`'s vocabulary (an error names the first that is not).
pub(crate) fn check_prompt_ids(model: &CausalLm, tokens: &[i64]) -> Result<()> {
    let vocab = model.config().vocab_size;
    match tokens
        .iter()
        .enumerate()
        .find(|(_, t)| **t < 0 || **t >= vocab)
    {
        Some((i, t)) => bail!("prompt[{i}] = {t} is outside the vocabulary (0..{vocab})"),
        None => Ok(()),
    }
}

/// Runs the model over `tokens` once and calls `f(start, lp)` for each chunk of positions, where
/// row `r` of `lp` is log_softmax (T = 1, f32) of the logits at position `start + r`: the
/// distribution of token `start + r + 1`. Token ids are checked against the vocabulary first.
pub(crate) fn next_token_logprobs(
    model: &CausalLm,
    tokens: &[i64],
    mut f: impl FnMut(i64, &Tensor) -> Result<()>,
) -> Result<()> {
    check_prompt_ids(model, tokens)?;
    if tokens.len() < 2 {
        return Ok(());
    }
    let device = model.device();
    tch::no_grad(|| -> Result<()> {
        let x = Tensor::from_slice(tokens).unsqueeze(0).to(device);
        let mask = x.ones_like();
        let pos = position_ids_from_mask(&mask);
        let hidden = model.forward_hidden(&x, &pos, &mask, None).get(0);
        let n = tokens.len() as i64 - 1;
        let mut start = 0;
        while start < n {
            let len = CHUNK.min(n - start);
            let lp = model
                .logits(&hidden.narrow(0, start, len))
                .log_softmax(-1, Kind::Float);
            f(start, &lp)?;
            start += len;
        }
        Ok(())
    })
}

/// One requested cell of `target_prompt_logprobs`: the logprob of `token` at prompt position
/// `row + 1` (given the tokens before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetCell {
    pub row: usize,
    pub token: i64,
}

/// The logprob (T = 1) of each cell's token at its position, in the order of `cells`. Rows must be
/// below `tokens.len() - 1` and tokens inside the vocabulary (checked: an error names the cell).
pub fn target_logprobs(model: &CausalLm, tokens: &[i64], cells: &[TargetCell]) -> Result<Vec<f32>> {
    let mut sink = TargetSink::new(model, tokens, cells)?;
    if !cells.is_empty() {
        next_token_logprobs(model, tokens, |start, lp| sink.take(start, lp))?;
    }
    Ok(sink.out)
}

/// Collects [`target_logprobs`]' answer from a prompt pass's chunks.
struct TargetSink<'a> {
    cells: &'a [TargetCell],
    /// Cell indices by row, so that each chunk gathers its own at once.
    order: Vec<usize>,
    /// The first cell of `order` not yet gathered.
    next: usize,
    device: Device,
    out: Vec<f32>,
}

impl<'a> TargetSink<'a> {
    fn new(model: &CausalLm, tokens: &[i64], cells: &'a [TargetCell]) -> Result<Self> {
        let vocab = model.config().vocab_size;
        let rows = tokens.len().saturating_sub(1);
        for (i, c) in cells.iter().enumerate() {
            if c.row >= rows {
                bail!(
                    "target_prompt_logprobs: cell {i} is in row {} of {rows} (len(prompt) - 1)",
                    c.row
                );
            }
            if c.token < 0 || c.token >= vocab {
                bail!(
                    "target_prompt_logprobs: cell {i} (row {}) asks for token {} outside the vocabulary (0..{vocab})",
                    c.row,
                    c.token
                );
            }
        }
        let mut order: Vec<usize> = (0..cells.len()).collect();
        order.sort_by_key(|&i| cells[i].row);
        Ok(TargetSink {
            cells,
            order,
            next: 0,
            device: model.device(),
            out: vec![0f32; cells.len()],
        })
    }

    fn take(&mut self, start: i64, lp: &Tensor) -> Result<()> {
        let (cells, order) = (self.cells, &self.order);
        let end = start as usize + lp.size()[0] as usize;
        let first = self.next;
        while self.next < order.len() && cells[order[self.next]].row < end {
            self.next += 1;
        }
        if first == self.next {
            return Ok(());
        }
        let mine = &order[first..self.next];
        let r: Vec<i64> = mine
            .iter()
            .map(|&i| (cells[i].row - start as usize) as i64)
            .collect();
        let t: Vec<i64> = mine.iter().map(|&i| cells[i].token).collect();
        let picked = lp.index(&[
            Some(Tensor::from_slice(&r).to(self.device)),
            Some(Tensor::from_slice(&t).to(self.device)),
        ]);
        let values = Vec::<f32>::try_from(picked.to(Device::Cpu))?;
        for (&i, v) in mine.iter().zip(values) {
            self.out[i] = v;
        }
        Ok(())
    }
}

/// `prompt_alt_tokens_k`'s draws: `k` token ids per prompt position after the first, row-major
/// `[len(prompt) - 1, k]`, and each one's logprob.
#[derive(Debug, Clone, PartialEq)]
pub struct AltDraws {
    pub tokens: Vec<i64>,
    pub logprobs: Vec<f32>,
    pub k: usize,
}

/// `k` independent draws, with replacement, from the next-token distribution at every prompt
/// position after the first, at `temperature` (0: the most likely token, k times). The logprobs
/// are the model's own (T = 1), as `prompt_logprobs` and `topk_prompt_logprobs` are: temper's
/// reading of "the model's logprob of tokens[i][j]". Draw `j` at row `i` inverts the tempered
/// CDF at a uniform from SplitMix64 of `(seed, i, j)`, so the draws do not depend on how
/// positions are chunked or on which device runs.
pub fn alt_draws(
    model: &CausalLm,
    tokens: &[i64],
    k: usize,
    temperature: f64,
    seed: u64,
) -> Result<AltDraws> {
    let mut sink = AltSink::new(model, tokens, k, temperature, seed);
    if k > 0 {
        next_token_logprobs(model, tokens, |start, lp| sink.take(start, lp))?;
    }
    Ok(sink.out)
}

/// Collects [`alt_draws`]' answer from a prompt pass's chunks.
struct AltSink {
    temperature: f64,
    seed: u64,
    vocab: i64,
    device: Device,
    out: AltDraws,
}

impl AltSink {
    fn new(model: &CausalLm, tokens: &[i64], k: usize, temperature: f64, seed: u64) -> Self {
        let rows = tokens.len().saturating_sub(1);
        AltSink {
            temperature,
            seed,
            vocab: model.config().vocab_size,
            device: model.device(),
            out: AltDraws {
                tokens: Vec::with_capacity(rows * k),
                logprobs: Vec::with_capacity(rows * k),
                k,
            },
        }
    }

    fn take(&mut self, start: i64, lp: &Tensor) -> Result<()> {
        let (k, vocab, seed) = (self.out.k, self.vocab, self.seed);
        if k == 0 {
            return Ok(());
        }
        let len = lp.size()[0];
        let ids = if self.temperature <= 0.0 {
            lp.argmax(-1, true).repeat([1, k as i64])
        } else {
            let cdf = (lp / self.temperature)
                .softmax(-1, Kind::Float)
                .cumsum(-1, Kind::Float);
            let total = cdf.narrow(1, vocab - 1, 1);
            let u: Vec<f32> = (0..len as u64)
                .flat_map(|r| (0..k as u64).map(move |j| (r, j)))
                .map(|(r, j)| {
                    let bits = mix(seed, start as u64 + r, j) >> 40;
                    bits as f32 / (1u64 << 24) as f32
                })
                .collect();
            let u = Tensor::from_slice(&u).view([len, k as i64]).to(self.device) * total;
            // The first token whose cumulative probability exceeds u (rounding can leave the
            // last cumulative value a hair under u: clamp into the vocabulary).
            u.searchsorted(&cdf, false, true, "right", None::<Tensor>)
                .clamp_max(vocab - 1)
        };
        let picked = lp.gather(1, &ids, false);
        self.out
            .tokens
            .extend(Vec::<i64>::try_from(ids.to(Device::Cpu).reshape([-1]))?);
        self.out
            .logprobs
            .extend(Vec::<f32>::try_from(picked.to(Device::Cpu).reshape([-1]))?);
        Ok(())
    }
}

/// What a request asks of its prompt's pass (any combination).
#[derive(Debug, Clone, Default)]
pub struct PromptAsk {
    /// Each token's logprob given the ones before (Tinker's `prompt_logprobs`, compute_logprobs).
    pub logprobs: bool,
    /// The top-k next tokens at every position (0: none).
    pub topk: usize,
    /// `target_prompt_logprobs`' cells.
    pub targets: Option<Vec<TargetCell>>,
    /// `prompt_alt_tokens_k`: (k, temperature, seed).
    pub alt: Option<(usize, f64, u64)>,
}

/// The answers to a [`PromptAsk`], each `None` when not asked; per-position lists hold `None` at
/// the first position (no context).
#[derive(Debug, Default)]
pub struct PromptScores {
    pub logprobs: Option<Vec<Option<f32>>>,
    pub topk: Option<Vec<Option<crate::PositionTop>>>,
    pub targets: Option<Vec<f32>>,
    pub alt: Option<AltDraws>,
}

/// Answers `ask` about `tokens` under `model`: the tokens' own logprobs by compute_logprobs'
/// path, and the top-k, target cells and draws from one shared pass over the prompt.
pub fn score_prompt(model: &CausalLm, tokens: &[i64], ask: &PromptAsk) -> Result<PromptScores> {
    let logprobs = match ask.logprobs {
        true => Some(crate::prompt_logprobs(model, tokens)?),
        false => None,
    };
    let mut topk = match ask.topk {
        0 => None,
        k => Some(crate::prompt_topk::TopkSink::new(model, tokens, k)?),
    };
    let mut targets = match &ask.targets {
        Some(cells) => Some(TargetSink::new(model, tokens, cells)?),
        None => None,
    };
    let mut alt = ask
        .alt
        .map(|(k, temperature, seed)| AltSink::new(model, tokens, k, temperature, seed));
    if topk.is_some() || targets.is_some() || alt.is_some() {
        next_token_logprobs(model, tokens, |start, lp| {
            if let Some(s) = &mut topk {
                s.take(start, lp)?;
            }
            if let Some(s) = &mut targets {
                s.take(start, lp)?;
            }
            if let Some(s) = &mut alt {
                s.take(start, lp)?;
            }
            Ok(())
        })?;
    }
    Ok(PromptScores {
        logprobs,
        topk: topk.map(|s| s.out),
        targets: targets.map(|s| s.out),
        alt: alt.map(|s| s.out),
    })
}
