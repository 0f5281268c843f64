//! The one sampling seam: where completions come from. The in-process [`Engine`] and the
//! inference servers ([`crate::remote::RemoteSampler`]: vLLM, SGLang, `temper serve`) both
//! answer a batch of requests with their samples, ordered by request and sample index. Every
//! request carries its own seed, so the tokens do not depend on which one answers or on how the
//! requests are batched. The trainer samples through it; environments route each request to the
//! policy's or a judge's sampler on top of it (`temper_env::Responders`).

use anyhow::Result;

use crate::remote::RemoteSampler;
use crate::{Engine, Request, Sample};

pub trait Sampler {
    /// The samples of every request, ordered by `(request_index, sample_index)`.
    fn sample(&self, requests: &[Request]) -> Result<Vec<Sample>>;
}

impl Sampler for Engine<'_> {
    fn sample(&self, requests: &[Request]) -> Result<Vec<Sample>> {
        self.generate(requests, &mut |_| {})
    }
}

impl Sampler for RemoteSampler {
    fn sample(&self, requests: &[Request]) -> Result<Vec<Sample>> {
        self.generate(requests)
    }
}
