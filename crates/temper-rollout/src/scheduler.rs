//! Which samples enter the decode batch, and when.
//!
//! Work is a FIFO queue of units: `count` samples of one request that share one prefill of its
//! prompt. A request with `n` larger than the batch is split into several units (one prefill each).
//! A unit enters only as a whole. When rows finish they free their slots; the queue refills them
//! once enough are free that the extra prefill pays: when the batch is empty, or when at least
//! `refill_min_free` slots are free.

use std::collections::VecDeque;

/// Samples `first_sample .. first_sample + count` of request `request`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub request: usize,
    pub first_sample: usize,
    pub count: usize,
    pub prompt_len: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most rows decoded together.
    pub max_rows: usize,
    /// Most padded prompt tokens prefilled in one forward (at least one unit is always admitted).
    pub max_prefill_tokens: usize,
    /// With rows still decoding, refill only when at least this many slots are free.
    pub refill_min_free: usize,
}

impl SchedulerConfig {
    /// Refill once a quarter of the batch is free.
    pub fn new(max_rows: usize, max_prefill_tokens: usize) -> Self {
        let max_rows = max_rows.max(1);
        Self {
            max_rows,
            max_prefill_tokens: max_prefill_tokens.max(1),
            refill_min_free: max_rows.div_ceil(4),
        }
    }
}

#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    queue: VecDeque<Unit>,
}

impl Scheduler {
    /// `requests[i] = (n, prompt_len)` for request `i`.
    pub fn new(requests: &[(usize, usize)], config: SchedulerConfig) -> Self {
        let mut s = Self {
            config,
            queue: VecDeque::new(),
        };
        for (request, &(n, prompt_len)) in requests.iter().enumerate() {
            s.push(request, n, prompt_len);
        }
        s
    }

    /// Queue `n` samples of request `request` (continuous batching adds work while decoding).
    pub fn push(&mut self, request: usize, n: usize, prompt_len: usize) {
        let mut first_sample = 0;
        while first_sample < n {
            let count = (n - first_sample).min(self.config.max_rows);
            self.queue.push_back(Unit {
                request,
                first_sample,
                count,
                prompt_len,
            });
            first_sample += count;
        }
    }

    /// Keep only the queued samples of the requests `keep` accepts.
    pub fn retain_requests(&mut self, mut keep: impl FnMut(usize) -> bool) {
        self.queue.retain(|u| keep(u.request));
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Units to prefill now, given how many rows are decoding.
    pub fn admit(&mut self, active_rows: usize) -> Vec<Unit> {
        let free = self.config.max_rows.saturating_sub(active_rows);
        if active_rows > 0 && free < self.config.refill_min_free {
            return Vec::new();
        }
        let mut admitted: Vec<Unit> = Vec::new();
        let (mut rows, mut longest) = (0, 0);
        while let Some(next) = self.queue.front() {
            let new_longest = longest.max(next.prompt_len);
            let fits_rows = rows + next.count <= free;
            let fits_tokens = (admitted.len() + 1) * new_longest <= self.config.max_prefill_tokens;
            if !fits_rows || (!admitted.is_empty() && !fits_tokens) {
                break;
            }
            rows += next.count;
            longest = new_longest;
            admitted.push(self.queue.pop_front().expect("front exists"));
        }
        admitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(units: &[Unit]) -> Vec<(usize, usize, usize)> {
        units
            .iter()
            .map(|u| (u.request, u.first_sample, u.count))
            .collect()
    }

    #[test]
    fn large_n_is_split_into_batch_sized_units() {
        let mut s = Scheduler::new(&[(10, 3)], SchedulerConfig::new(4, 1000));
        assert_eq!(counts(&s.admit(0)), vec![(0, 0, 4)]);
        assert_eq!(counts(&s.admit(0)), vec![(0, 4, 4)]);
        assert_eq!(counts(&s.admit(0)), vec![(0, 8, 2)]);
        assert!(s.is_empty() && s.admit(0).is_empty());
    }

    #[test]
    fn whole_units_fill_free_slots_in_order() {
        let mut s = Scheduler::new(
            &[(3, 5), (3, 5), (2, 5), (1, 5)],
            SchedulerConfig::new(8, 1000),
        );
        // 3 + 3 fit, the next 2 also fit (8), the last waits.
        assert_eq!(counts(&s.admit(0)), vec![(0, 0, 3), (1, 0, 3), (2, 0, 2)]);
        // 1 free slot < refill_min_free (2): keep decoding.
        assert!(s.admit(7).is_empty());
        assert_eq!(counts(&s.admit(6)), vec![(3, 0, 1)]);
        assert!(s.is_empty());
    }

    #[test]
    fn prefill_token_budget_limits_a_wave_but_never_blocks() {
        let cfg = SchedulerConfig::new(16, 20);
        let mut s = Scheduler::new(&[(1, 8), (1, 8), (1, 30), (1, 2)], cfg);
        // 2 x 8 = 16 tokens fit, a third (3 x 30 padded) does not.
        assert_eq!(counts(&s.admit(0)), vec![(0, 0, 1), (1, 0, 1)]);
        // A prompt longer than the budget is still admitted alone.
        assert_eq!(counts(&s.admit(0)), vec![(2, 0, 1)]);
        assert_eq!(counts(&s.admit(0)), vec![(3, 0, 1)]);
    }
}
