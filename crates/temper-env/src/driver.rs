//! Running many episode groups together: every round, the prompts all groups are waiting on go
//! to the sampler in one batched call (all agents of a debate round, every question of the
//! step), then each group gets its answers and says what it needs next.
use anyhow::{bail, Result};
use temper_rollout::{Request, Sample, SamplingParams};

/// Who answers a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Responder {
    /// The policy being trained.
    Policy,
    /// A separate frozen model (a debate judge given by path).
    Judge,
}

/// One prompt a group is waiting on. `params.seed` is set by the group from its own seed, so
/// what is drawn does not depend on what it is batched with.
#[derive(Clone, Debug)]
pub struct Ask {
    pub prompt_ids: Vec<i64>,
    pub params: SamplingParams,
    pub responder: Responder,
}

/// An answered [`Ask`]: the samples (`params.n` of them) and their decoded texts.
pub struct Answer {
    pub samples: Vec<Sample>,
    pub texts: Vec<String>,
}

/// A set of episodes that share an advantage baseline (the `n` samples of a question, the
/// debates about one question), advanced round by round.
pub trait EnvGroup: Send {
    /// The prompts this group needs answered now; empty once it is done.
    fn asks(&mut self) -> Result<Vec<Ask>>;
    /// The answers to the last [`EnvGroup::asks`], in the same order.
    fn answer(&mut self, answers: Vec<Answer>) -> Result<()>;
}

/// Who answers what: each responder's batch of requests goes to its sampler (the policy's, a
/// judge's; each a [`temper_rollout::Sampler`]), and tokens are decoded.
pub trait Responders {
    fn generate(&mut self, responder: Responder, requests: &[Request]) -> Result<Vec<Sample>>;
    fn decode(&self, ids: &[i64]) -> Result<String>;
}

/// Run `groups` to completion; one sampler call per responder per round, all groups together.
/// `progress(round, asks)` is told each round's size before it is sampled.
pub fn run_groups(
    sampler: &mut dyn Responders,
    groups: &mut [Box<dyn EnvGroup + '_>],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let mut round = 0;
    loop {
        // (group, ask) in order.
        let mut pending: Vec<(usize, Ask)> = vec![];
        for (g, group) in groups.iter_mut().enumerate() {
            pending.extend(group.asks()?.into_iter().map(|a| (g, a)));
        }
        if pending.is_empty() {
            return Ok(());
        }
        round += 1;
        if round > 1000 {
            bail!("episodes still asking after 1000 rounds");
        }
        progress(round, pending.len());
        let mut answers: Vec<Option<Answer>> = (0..pending.len()).map(|_| None).collect();
        for responder in [Responder::Policy, Responder::Judge] {
            let idx: Vec<usize> = (0..pending.len())
                .filter(|&i| pending[i].1.responder == responder)
                .collect();
            if idx.is_empty() {
                continue;
            }
            let requests: Vec<Request> = idx
                .iter()
                .map(|&i| Request {
                    prompt_ids: pending[i].1.prompt_ids.clone(),
                    params: pending[i].1.params.clone(),
                })
                .collect();
            let samples = sampler.generate(responder, &requests)?;
            let mut per_request: Vec<Vec<Sample>> = vec![vec![]; requests.len()];
            for s in samples {
                let k = s.request_index;
                if k >= per_request.len() {
                    bail!("the sampler answered request {k} of {}", requests.len());
                }
                per_request[k].push(s);
            }
            for (k, samples) in per_request.into_iter().enumerate() {
                let want = requests[k].params.n;
                if samples.len() != want {
                    bail!(
                        "the sampler gave {} samples for a request of n = {want}",
                        samples.len()
                    );
                }
                let texts = samples
                    .iter()
                    .map(|s| sampler.decode(&s.completion_ids))
                    .collect::<Result<Vec<_>>>()?;
                answers[idx[k]] = Some(Answer { samples, texts });
            }
        }
        // Hand each group its answers, in ask order.
        let mut by_group: Vec<Vec<Answer>> = (0..groups.len()).map(|_| vec![]).collect();
        for ((g, _), a) in pending.iter().zip(answers) {
            by_group[*g].push(a.expect("every ask answered"));
        }
        for (g, a) in by_group.into_iter().enumerate() {
            if !a.is_empty() {
                groups[g].answer(a)?;
            }
        }
    }
}

/// A group borrowed for a run (the caller keeps it to read the episodes afterwards).
impl<T: EnvGroup + ?Sized> EnvGroup for &mut T {
    fn asks(&mut self) -> Result<Vec<Ask>> {
        (**self).asks()
    }
    fn answer(&mut self, answers: Vec<Answer>) -> Result<()> {
        (**self).answer(answers)
    }
}
