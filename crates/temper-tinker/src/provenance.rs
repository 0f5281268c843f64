//! Provenance and the sampler's records: what StableReinforce needs from sampling time.
//!
//! A sample request with `record_stability_info` has every sampled sequence recorded under its
//! `sequence_id`: the request's prompt, the sampled tokens and the logprob of each under the
//! distribution it was drawn from. A training datum then names, run by run, where its tokens came
//! from (Tinker's `Datum.model_input_spans` / `loss_fn_input_spans`: a run is `length` positions
//! of a sequence's prompt or of its sampled tokens, from `offset`; the runs of a field tile it).
//! [`SequenceRecords::resolve`] checks the runs against the records (tiling, ranges, the very
//! tokens) and gives, per target position, the recorded logprob of a sampled token
//! ([`Recorded`]).
//!
//! The records are bounded: at most `cap_tokens` tokens in all (prompt and sampled, counted per
//! sequence), the oldest dropped first; a record unused for `ttl` is dropped (Tinker keeps them one
//! day after the last use); a session's records go with it. A datum naming a dropped or unknown
//! sequence is a user error that says so.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Which part of a sampled sequence a run of positions reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanSource {
    /// Positions `[offset, offset + length)` of the prompt of the request that sampled it.
    Prompt,
    /// Positions `[offset, offset + length)` of its sampled tokens.
    Sampled,
}

/// One run of a provenance list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub source: SpanSource,
    pub sequence_id: String,
    pub offset: i64,
    pub length: i64,
}

/// A datum's provenance: the runs tiling `model_input` and those tiling `target_tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Provenance {
    pub model_input: Vec<Span>,
    pub targets: Vec<Span>,
}

impl Provenance {
    /// The runs' own rules, checked without any record: offsets and lengths >= 0, and each list
    /// tiles its field exactly. A loss that does not read the records (every loss but
    /// `stable_reinforce`) checks only this: the SDK and the cookbook attach provenance to every
    /// datum whose tokens were sampled, recorded or not.
    pub fn check_tiling(&self, index: usize, model_input: usize, targets: usize) -> Result<()> {
        let fields = [
            ("model_input_spans", &self.model_input, model_input),
            ("loss_fn_input_spans", &self.targets, targets),
        ];
        for (field, spans, len) in fields {
            let mut pos = 0usize;
            for (k, span) in spans.iter().enumerate() {
                if span.offset < 0 || span.length < 0 {
                    bail!(
                        "datum {index}: {field}[{k}]: offset {} and length {} must be >= 0",
                        span.offset,
                        span.length
                    );
                }
                match pos.checked_add(span.length as usize).filter(|&e| e <= len) {
                    Some(end) => pos = end,
                    None => bail!(
                        "datum {index}: {field}[{k}]: the runs cover more than the field's {len} \
                         positions"
                    ),
                }
            }
            if pos != len {
                bail!(
                    "datum {index}: {field} cover {pos} positions, the field has {len}; the runs \
                     must tile it exactly"
                );
            }
        }
        Ok(())
    }
}

/// What the sampler recorded, per target position of a datum.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// The recorded logprob of the target where it is a sampled token, else 0.
    pub logprobs: Vec<f32>,
    /// Whether the target is a sampled token.
    pub sampled: Vec<bool>,
}

/// One recorded sequence.
struct Record {
    session: String,
    prompt: Arc<Vec<i64>>,
    tokens: Vec<i64>,
    logprobs: Vec<f32>,
    last_used: Instant,
}

impl Record {
    fn size(&self) -> usize {
        self.prompt.len() + self.tokens.len()
    }
}

#[derive(Default)]
struct Inner {
    records: HashMap<String, Record>,
    /// Ids in the order they were recorded (ids already dropped are skipped when popped).
    order: VecDeque<String>,
    tokens: usize,
}

impl Inner {
    fn drop_record(&mut self, id: &str) {
        if let Some(r) = self.records.remove(id) {
            self.tokens -= r.size();
        }
    }
}

/// The recorded sequences of a server, bounded in tokens and time.
pub struct SequenceRecords {
    inner: Mutex<Inner>,
    cap_tokens: usize,
    ttl: Duration,
}

/// The tokens a server keeps records for at most (prompt and sampled tokens per sequence):
/// about 200 MB of tokens and logprobs.
pub const DEFAULT_RECORD_CAP_TOKENS: usize = 16 << 20;

/// How long an unused record is kept (Tinker: one day after sampling or the last training use).
pub const DEFAULT_RECORD_TTL: Duration = Duration::from_secs(24 * 3600);

impl SequenceRecords {
    pub fn new(cap_tokens: usize, ttl: Duration) -> SequenceRecords {
        SequenceRecords {
            inner: Mutex::new(Inner::default()),
            cap_tokens,
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records sequence `id` of `session`: sampled from `prompt`, its `tokens` and their
    /// `logprobs`. The oldest records go first when the cap is passed.
    pub fn record(
        &self,
        id: &str,
        session: &str,
        prompt: Arc<Vec<i64>>,
        tokens: Vec<i64>,
        mut logprobs: Vec<f32>,
    ) {
        // The engine gives one logprob per token; keep the two aligned whatever a caller passes.
        logprobs.resize(tokens.len(), 0.0);
        let record = Record {
            session: session.to_string(),
            prompt,
            tokens,
            logprobs,
            last_used: Instant::now(),
        };
        let mut s = self.lock();
        s.drop_record(id);
        s.tokens += record.size();
        s.records.insert(id.to_string(), record);
        s.order.push_back(id.to_string());
        while s.tokens > self.cap_tokens {
            let Some(old) = s.order.pop_front() else {
                break;
            };
            s.drop_record(&old);
        }
        // The order list keeps ids already dropped until they reach its front; compact it when
        // it has grown well past the records it names.
        if s.order.len() > 2 * s.records.len() + 1024 {
            let Inner { records, order, .. } = &mut *s;
            order.retain(|id| records.contains_key(id));
        }
    }

    /// Drops every record of session `session`.
    pub fn forget_session(&self, session: &str) {
        let mut s = self.lock();
        let ids: Vec<String> = s
            .records
            .iter()
            .filter(|(_, r)| r.session == session)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            s.drop_record(&id);
        }
    }

    /// How many sequences and tokens are recorded.
    pub fn usage(&self) -> (usize, usize) {
        let s = self.lock();
        (s.records.len(), s.tokens)
    }

    /// Checks datum `index`'s provenance against the records of `session` and the datum's own
    /// tokens, and returns what was recorded per target position. Every error is one line naming
    /// the datum, the field and the run.
    pub fn resolve(
        &self,
        index: usize,
        session: &str,
        provenance: &Provenance,
        model_input: &[i64],
        targets: &[i64],
    ) -> Result<Recorded> {
        provenance.check_tiling(index, model_input.len(), targets.len())?;
        let mut s = self.lock();
        let now = Instant::now();
        let fields = [
            ("model_input_spans", &provenance.model_input, model_input),
            ("loss_fn_input_spans", &provenance.targets, targets),
        ];
        let mut recorded = Recorded {
            logprobs: vec![0.0; targets.len()],
            sampled: vec![false; targets.len()],
        };
        for (field, spans, tokens) in fields {
            let mut pos = 0usize;
            for (k, span) in spans.iter().enumerate() {
                let at = || format!("datum {index}: {field}[{k}]");
                // In range: check_tiling above.
                let (offset, length) = (span.offset as usize, span.length as usize);
                let end = pos + length;
                let expired = self.ttl;
                let r = match s.records.get_mut(&span.sequence_id) {
                    Some(r)
                        if r.session == session && now.duration_since(r.last_used) <= expired =>
                    {
                        r
                    }
                    Some(r) if r.session != session => bail!(
                        "{}: sequence_id {:?} was sampled in another session; provenance works \
                         within one session",
                        at(),
                        span.sequence_id
                    ),
                    _ => bail!(
                        "{}: sequence_id {:?} is not recorded on this server (never sampled with \
                         record_stability_info=True, unused for over {} s, dropped past the cap of \
                         {} recorded tokens, or its session ended)",
                        at(),
                        span.sequence_id,
                        expired.as_secs(),
                        self.cap_tokens
                    ),
                };
                r.last_used = now;
                let source: &[i64] = match span.source {
                    SpanSource::Prompt => &r.prompt,
                    SpanSource::Sampled => &r.tokens,
                };
                let what = match span.source {
                    SpanSource::Prompt => "prompt",
                    SpanSource::Sampled => "sampled tokens",
                };
                let Some(src) = offset
                    .checked_add(length)
                    .and_then(|e| source.get(offset..e))
                else {
                    bail!(
                        "{}: offset {offset} + length {length} is past the end of sequence {:?}'s \
                         {what} ({} tokens)",
                        at(),
                        span.sequence_id,
                        source.len()
                    );
                };
                if let Some(i) = (0..length).find(|&i| src[i] != tokens[pos + i]) {
                    bail!(
                        "{}: position {} holds token {}, but sequence {:?}'s {what}[{}] is {}",
                        at(),
                        pos + i,
                        tokens[pos + i],
                        span.sequence_id,
                        offset + i,
                        src[i]
                    );
                }
                if field == "loss_fn_input_spans" && span.source == SpanSource::Sampled {
                    for i in 0..length {
                        recorded.logprobs[pos + i] = r.logprobs[offset + i];
                        recorded.sampled[pos + i] = true;
                    }
                }
                pos = end;
            }
        }
        // Records past their time go when they are next looked at; sweep the rest now and then.
        if s.records.len() > 4096 {
            let stale: Vec<String> = s
                .records
                .iter()
                .filter(|(_, r)| now.duration_since(r.last_used) > self.ttl)
                .map(|(id, _)| id.clone())
                .collect();
            for id in stale {
                s.drop_record(&id);
            }
        }
        Ok(recorded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(source: SpanSource, id: &str, offset: i64, length: i64) -> Span {
        Span {
            source,
            sequence_id: id.into(),
            offset,
            length,
        }
    }

    /// The cookbook's `rl_loop` layout: input = prompt + sampled[..-1], targets = prompt[1..] +
    /// sampled.
    fn rl_loop_datum(
        prompt: &[i64],
        sampled: &[i64],
        id: &str,
    ) -> (Vec<i64>, Vec<i64>, Provenance) {
        let input: Vec<i64> = prompt
            .iter()
            .chain(&sampled[..sampled.len() - 1])
            .copied()
            .collect();
        let targets: Vec<i64> = prompt[1..].iter().chain(sampled).copied().collect();
        let p = prompt.len() as i64;
        let n = sampled.len() as i64;
        let prov = Provenance {
            model_input: vec![
                span(SpanSource::Prompt, id, 0, p),
                span(SpanSource::Sampled, id, 0, n - 1),
            ],
            targets: vec![
                span(SpanSource::Prompt, id, 1, p - 1),
                span(SpanSource::Sampled, id, 0, n),
            ],
        };
        (input, targets, prov)
    }

    #[test]
    fn resolves_the_recorded_logprobs_of_sampled_targets() {
        let r = SequenceRecords::new(1000, DEFAULT_RECORD_TTL);
        r.record(
            "s:seq:0-0",
            "s",
            Arc::new(vec![5, 6, 7]),
            vec![8, 9],
            vec![-0.5, -1.5],
        );
        let (input, targets, prov) = rl_loop_datum(&[5, 6, 7], &[8, 9], "s:seq:0-0");
        let rec = r.resolve(0, "s", &prov, &input, &targets).unwrap();
        assert_eq!(rec.sampled, vec![false, false, true, true]);
        assert_eq!(rec.logprobs, vec![0.0, 0.0, -0.5, -1.5]);
    }

    /// Provenance naming sequences nobody recorded (what the cookbook attaches when the loss is
    /// not `stable_reinforce`) passes the tiling check; a list that does not tile does not.
    #[test]
    fn tiling_needs_no_records() {
        let (input, targets, prov) = rl_loop_datum(&[5, 6, 7], &[8, 9], "s:seq:0-0");
        prov.check_tiling(0, input.len(), targets.len()).unwrap();
        let e = prov
            .check_tiling(3, input.len() + 1, targets.len())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("datum 3: model_input_spans cover 4 positions"),
            "{e}"
        );
        let mut short = prov.clone();
        short.targets[1].length = 5;
        let e = short
            .check_tiling(0, input.len(), targets.len())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("datum 0: loss_fn_input_spans[1]: the runs cover more"),
            "{e}"
        );
        let r = SequenceRecords::new(1000, DEFAULT_RECORD_TTL);
        let e = r.resolve(0, "s", &prov, &input, &targets).unwrap_err();
        assert!(e.to_string().contains("is not recorded"), "{e}");
    }

    #[test]
    fn bad_provenance_is_a_one_line_error_naming_the_run() {
        let r = SequenceRecords::new(1000, DEFAULT_RECORD_TTL);
        r.record(
            "a",
            "s",
            Arc::new(vec![5, 6, 7]),
            vec![8, 9],
            vec![-0.5, -1.5],
        );
        let (input, targets, prov) = rl_loop_datum(&[5, 6, 7], &[8, 9], "a");
        let err = |prov: &Provenance, input: &[i64], targets: &[i64], session: &str| {
            r.resolve(3, session, prov, input, targets)
                .unwrap_err()
                .to_string()
        };
        let mut wrong = targets.clone();
        wrong[3] = 1;
        let e = err(&prov, &input, &wrong, "s");
        assert!(
            e.contains("datum 3: loss_fn_input_spans[1]: position 3 holds token 1"),
            "{e}"
        );
        assert!(err(&prov, &input, &targets, "t").contains("another session"));
        let mut unknown = prov.clone();
        unknown.targets[1].sequence_id = "b".into();
        assert!(err(&unknown, &input, &targets, "s").contains("\"b\" is not recorded"));
        let mut past = prov.clone();
        past.targets[1].offset = 1;
        let e = err(&past, &input, &targets, "s");
        assert!(
            e.contains("past the end of sequence \"a\"'s sampled tokens"),
            "{e}"
        );
        let mut short = prov.clone();
        short.model_input.pop();
        assert!(err(&short, &input, &targets, "s").contains("must tile it exactly"));
        let mut long = prov.clone();
        long.targets[1].length = 9;
        assert!(err(&long, &input, &targets, "s").contains("cover more than"));
        let mut negative = prov;
        negative.targets[0].offset = -1;
        assert!(err(&negative, &input, &targets, "s").contains("must be >= 0"));
    }

    #[test]
    fn records_are_bounded_and_go_with_their_session() {
        let r = SequenceRecords::new(10, DEFAULT_RECORD_TTL);
        let prompt = Arc::new(vec![1, 2, 3]);
        for k in 0..5 {
            r.record(
                &format!("x{k}"),
                "s",
                prompt.clone(),
                vec![4, 5],
                vec![0.0, 0.0],
            );
        }
        // 5 tokens each, a cap of 10: the two newest stay.
        assert_eq!(r.usage(), (2, 10));
        let (input, targets, prov) = rl_loop_datum(&[1, 2, 3], &[4, 5], "x0");
        assert!(r.resolve(0, "s", &prov, &input, &targets).is_err());
        let (input, targets, prov) = rl_loop_datum(&[1, 2, 3], &[4, 5], "x4");
        assert!(r.resolve(0, "s", &prov, &input, &targets).is_ok());
        r.forget_session("s");
        assert_eq!(r.usage(), (0, 0));
        let stale = SequenceRecords::new(10, Duration::ZERO);
        stale.record("y", "s", prompt, vec![4, 5], vec![0.0, 0.0]);
        std::thread::sleep(Duration::from_millis(5));
        let (input, targets, prov) = rl_loop_datum(&[1, 2, 3], &[4, 5], "y");
        let e = stale.resolve(0, "s", &prov, &input, &targets).unwrap_err();
        assert!(e.to_string().contains("unused for over 0 s"), "{e}");
    }
}
