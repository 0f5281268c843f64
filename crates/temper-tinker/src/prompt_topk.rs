//! The top-k next-token logprobs at every prompt position (Tinker's `topk_prompt_logprobs`, the
//! teacher's distribution that distillation trains onto; vLLM's and SGLang's top logprobs).

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};
use temper_model::CausalLm;

/// The largest `k` served (vLLM's default `max_logprobs` is 20; tinker-cookbook's distillation
/// asks for 20).
pub const MAX_TOPK: usize = 64;

/// One position's top tokens: (token id, logprob), most likely first.
pub type TopTokens = Vec<(i64, f32)>;

/// One position's top tokens, and its own token's logprob and rank (1 = the most likely; as
/// vLLM counts: one more than the tokens with a strictly higher logprob).
#[derive(Debug, Clone, PartialEq)]
pub struct PositionTop {
    pub top: TopTokens,
    pub logprob: f32,
    pub rank: i64,
}

/// Per position of `tokens`, the `k` most likely next tokens given the tokens before it, most
/// likely first, as log_softmax of the logits at T = 1 (`None` for the first position, which has
/// no context). Ties keep libtorch's `topk` order.
pub fn prompt_topk(model: &CausalLm, tokens: &[i64], k: usize) -> Result<Vec<Option<TopTokens>>> {
    Ok(prompt_topk_ranked(model, tokens, k)?
        .into_iter()
        .map(|p| p.map(|p| p.top))
        .collect())
}

/// [`prompt_topk`] with each position's own token's logprob and rank.
pub fn prompt_topk_ranked(
    model: &CausalLm,
    tokens: &[i64],
    k: usize,
) -> Result<Vec<Option<PositionTop>>> {
    let mut sink = TopkSink::new(model, tokens, k)?;
    crate::prompt_pass::next_token_logprobs(model, tokens, |start, lp| sink.take(start, lp))?;
    Ok(sink.out)
}

/// Collects [`prompt_topk_ranked`]'s answer from a prompt pass's chunks
/// ([`crate::prompt_pass::next_token_logprobs`]).
pub(crate) struct TopkSink<'a> {
    tokens: &'a [i64],
    k: i64,
    device: Device,
    pub out: Vec<Option<PositionTop>>,
}

impl<'a> TopkSink<'a> {
    pub fn new(model: &CausalLm, tokens: &'a [i64], k: usize) -> Result<Self> {
        if k == 0 || k > MAX_TOPK {
            bail!("top-k logprobs: k = {k} must be 1 to {MAX_TOPK}");
        }
        let mut out: Vec<Option<PositionTop>> = vec![None];
        out.truncate(tokens.len());
        Ok(TopkSink {
            tokens,
            k: (k as i64).min(model.config().vocab_size),
            device: model.device(),
            out,
        })
    }

    /// The chunk of positions from `start` (`lp`: their next-token log-probs).
    pub fn take(&mut self, start: i64, lp: &Tensor) -> Result<()> {
        let (k, len) = (self.k, lp.size()[0]);
        let (values, ids) = lp.topk(k, -1, true, true);
        let next = &self.tokens[(start + 1) as usize..(start + 1 + len) as usize];
        let own = lp.gather(
            1,
            &Tensor::from_slice(next).to(self.device).unsqueeze(1),
            false,
        );
        let ranks = lp.gt_tensor(&own).sum_dim_intlist(1, false, Kind::Int64) + 1;
        let cpu = |t: Tensor| t.to(Device::Cpu).reshape([-1]);
        let values = Vec::<f32>::try_from(cpu(values))?;
        let ids = Vec::<i64>::try_from(cpu(ids))?;
        let own = Vec::<f32>::try_from(cpu(own))?;
        let ranks = Vec::<i64>::try_from(cpu(ranks))?;
        for row in 0..len as usize {
            let r = row * k as usize..(row + 1) * k as usize;
            let top = ids[r.clone()].iter().copied();
            self.out.push(Some(PositionTop {
                top: top.zip(values[r].iter().copied()).collect(),
                logprob: own[row],
                rank: ranks[row],
            }));
        }
        Ok(())
    }
}
