//! Admission limits, as vLLM's server has them (`--max-num-seqs`, `--max-model-len`, ...): every
//! request is checked against them before anything is allocated for it, and one out of range is
//! refused with a message naming the request field and the limit (the flag that sets it).

/// The bounds `temper serve` admits requests within.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body (`--max-request-bytes`). The Tinker SDK sends forward_backward data
    /// in chunks of up to 5,000,000 bytes; the default leaves room for larger hand-made calls.
    pub max_request_bytes: usize,
    /// Largest `n` / `num_samples` of one request (`--max-n`).
    pub max_n: usize,
    /// Most prompts in one request (`--max-prompts`).
    pub max_prompts: usize,
    /// Longest prompt + completion (`--max-model-len`; default: the model's
    /// `max_position_embeddings`).
    pub max_model_len: usize,
    /// Most requests queued or running in the sampling worker at once (`--max-queued-requests`);
    /// beyond it a request is refused as busy (HTTP 503, which clients retry).
    pub max_queued: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_bytes: 64 << 20,
            max_n: 1024,
            max_prompts: 4096,
            max_model_len: 32768,
            max_queued: 8192,
        }
    }
}

/// How one API names the fields a sampling request's limits apply to.
pub struct FieldNames {
    pub prompt: &'static str,
    pub n: &'static str,
    pub max_tokens: &'static str,
}

pub const OPENAI_FIELDS: FieldNames = FieldNames {
    prompt: "prompt",
    n: "n",
    max_tokens: "max_tokens",
};
pub const SGLANG_FIELDS: FieldNames = FieldNames {
    prompt: "input_ids",
    n: "sampling_params.n",
    max_tokens: "sampling_params.max_new_tokens",
};
pub const TINKER_FIELDS: FieldNames = FieldNames {
    prompt: "prompt",
    n: "num_samples",
    max_tokens: "sampling_params.max_tokens",
};

impl Limits {
    /// Checks `prompts` (token counts), `n` and `max_tokens` of one sampling request.
    pub fn check_sampling(
        &self,
        prompt_lens: &[usize],
        n: usize,
        max_tokens: usize,
        f: &FieldNames,
    ) -> Result<(), String> {
        if n > self.max_n {
            return Err(format!(
                "{} = {n}: at most {} samples per request (--max-n)",
                f.n, self.max_n
            ));
        }
        if prompt_lens.len() > self.max_prompts {
            return Err(format!(
                "{}: {} prompts; at most {} per request (--max-prompts)",
                f.prompt,
                prompt_lens.len(),
                self.max_prompts
            ));
        }
        for (i, &len) in prompt_lens.iter().enumerate() {
            if len.saturating_add(max_tokens) > self.max_model_len {
                let at = if prompt_lens.len() > 1 {
                    format!("{}[{i}]", f.prompt)
                } else {
                    f.prompt.to_string()
                };
                return Err(format!(
                    "{at} has {len} tokens and {} = {max_tokens}: {} tokens in all, more than the \
                     model's maximum context length of {} tokens (--max-model-len)",
                    f.max_tokens,
                    len.saturating_add(max_tokens),
                    self.max_model_len
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_requests_name_the_field_and_the_limit() {
        let l = Limits {
            max_model_len: 100,
            max_n: 4,
            max_prompts: 2,
            ..Limits::default()
        };
        assert!(l.check_sampling(&[10], 4, 90, &OPENAI_FIELDS).is_ok());
        let e = l
            .check_sampling(&[10], 100000000000, 5, &OPENAI_FIELDS)
            .unwrap_err();
        assert!(
            e.starts_with("n = 100000000000") && e.contains("--max-n"),
            "{e}"
        );
        let e = l
            .check_sampling(&[10, 95], 1, 6, &SGLANG_FIELDS)
            .unwrap_err();
        assert!(e.starts_with("input_ids[1] has 95 tokens"), "{e}");
        assert!(e.contains("sampling_params.max_new_tokens = 6"), "{e}");
        let e = l
            .check_sampling(&[1, 1, 1], 1, 1, &TINKER_FIELDS)
            .unwrap_err();
        assert!(e.contains("--max-prompts"), "{e}");
        let e = l
            .check_sampling(&[1], 1, usize::MAX, &TINKER_FIELDS)
            .unwrap_err();
        assert!(e.contains("sampling_params.max_tokens"), "{e}");
    }
}
