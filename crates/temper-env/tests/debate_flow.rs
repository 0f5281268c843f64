//! Debates end to end on a character-level codec and a scripted sampler (no model): the
//! token-extension invariant across rounds, the spliced opponent tokens, the judges, and every
//! training mode's advantages against a hand computation.
use anyhow::Result;
use temper_env::debate::judge::{JudgeKind, Side, Verdict};
use temper_env::debate::{DebateConfig, DebateGroup, DebateTemplates};
use temper_env::train_data::{debate_datums, DebateTrain};
use temper_env::{run_groups, ChatTurns, Codec, Responder, Responders, Task};
use temper_model::ChatMessage;
use temper_rollout::{Finish, Request, Sample, SamplingParams};

const EOS: i64 = 1_000;
const START: i64 = 1_001;

/// Characters are their code points; `<|im_end|>` and `<|im_start|>` are single ids.
struct Chars;

impl Codec for Chars {
    fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let mut out = vec![];
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("<|im_end|>") {
                out.push(EOS);
                rest = r;
            } else if let Some(r) = rest.strip_prefix("<|im_start|>") {
                out.push(START);
                rest = r;
            } else {
                let c = rest.chars().next().unwrap();
                out.push(c as i64);
                rest = &rest[c.len_utf8()..];
            }
        }
        Ok(out)
    }
    fn decode(&self, ids: &[i64]) -> Result<String> {
        Ok(ids
            .iter()
            .filter(|&&t| t < EOS)
            .map(|&t| char::from_u32(t as u32).unwrap())
            .collect())
    }
    fn token_text(&self, id: i64) -> Option<String> {
        match id {
            EOS => Some("<|im_end|>".into()),
            START => Some("<|im_start|>".into()),
            t => char::from_u32(t as u32).map(String::from),
        }
    }
    fn render(&self, messages: &[ChatMessage]) -> Result<String> {
        let mut s = String::new();
        for m in messages {
            s.push_str(&format!(
                "<|im_start|>{}\n{}<|im_end|>\n",
                m.role, m.content
            ));
        }
        s.push_str("<|im_start|>assistant\n");
        Ok(s)
    }
}

/// Answers from the request's seed: `<SOLUTION>k</SOLUTION>` with k = seed % 3, a confidence,
/// and EOS; a judge prompt gets `<VERDICT>A</VERDICT>` or garbage by seed.
struct Scripted {
    calls: Vec<(Responder, usize)>,
}

impl Responders for Scripted {
    fn generate(&mut self, who: Responder, requests: &[Request]) -> Result<Vec<Sample>> {
        self.calls.push((who, requests.len()));
        Ok(requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let seed = r.params.seed.unwrap();
                let prompt = Chars.decode(&r.prompt_ids).unwrap();
                let text = if prompt.contains("You are the judge") {
                    if seed % 4 == 0 {
                        "hmm".to_string()
                    } else {
                        "<VERDICT>A</VERDICT>".to_string()
                    }
                } else {
                    format!(
                        "<SOLUTION>{}</SOLUTION><CONFIDENCE>{}</CONFIDENCE>",
                        seed % 3,
                        seed % 100
                    )
                };
                let mut ids = Chars.encode(&text).unwrap();
                ids.push(EOS);
                Sample {
                    request_index: i,
                    sample_index: 0,
                    prompt_ids: r.prompt_ids.clone(),
                    completion_logprobs: ids.iter().map(|&t| -((t % 7) as f32) / 10.0).collect(),
                    completion_ids: ids,
                    finish: Finish::Stop,
                    stop_reason: None,
                    completion_versions: vec![],
                }
            })
            .collect())
    }
    fn decode(&self, ids: &[i64]) -> Result<String> {
        Chars.decode(ids)
    }
}

fn config(judge: JudgeKind) -> DebateConfig {
    DebateConfig {
        judge,
        params: SamplingParams::default(),
        judge_params: SamplingParams {
            temperature: 0.3,
            ..SamplingParams::default()
        },
        templates: DebateTemplates::default(),
        eos_ids: vec![EOS],
    }
}

fn qa() -> Box<dyn Task> {
    temper_env::task_by_name(
        "qa",
        Some(vec![serde_json::json!({"question": "1+1?", "answer": "2"})]),
        &serde_json::Value::Null,
    )
    .unwrap()
}

fn run(judge: JudgeKind, seeds: &[u64]) -> (DebateGroup<'static>, Vec<(Responder, usize)>) {
    let task: &'static dyn Task = Box::leak(qa());
    let turns: &'static ChatTurns = Box::leak(Box::new(ChatTurns::from_template(&Chars).unwrap()));
    let cfg: &'static DebateConfig = Box::leak(Box::new(config(judge)));
    let mut group = DebateGroup::new(task.question(0, 0), task, &Chars, turns, cfg, seeds).unwrap();
    let mut sampler = Scripted { calls: vec![] };
    {
        let mut groups: Vec<Box<dyn temper_env::EnvGroup + '_>> = vec![Box::new(&mut group)];
        run_groups(&mut sampler, &mut groups, &mut |_, _| {}).unwrap();
    }
    (group, sampler.calls)
}

#[test]
fn rounds_extend_each_transcript_and_splice_the_opponent_tokens() {
    let (g, calls) = run(JudgeKind::Mock, &[11, 12]);
    // Three rounds, all four debaters of both debates in one call each; no judge call.
    assert_eq!(calls, vec![(Responder::Policy, 4); 3]);
    let turns = ChatTurns::from_template(&Chars).unwrap();
    assert_eq!(turns.assistant_to_user, "<|im_end|>\n<|im_start|>user\n");
    assert_eq!(
        turns.user_to_assistant,
        "<|im_end|>\n<|im_start|>assistant\n"
    );
    for d in &g.debates {
        for a in 0..2 {
            let t = &d.agents[a];
            assert_eq!(t.turns.len(), 3);
            for k in 1..3 {
                // Prompt k = prompt k-1 + completion k-1 + observation.
                let prev_end = t.turns[k - 1].prompt_len + t.turns[k - 1].completion_len;
                assert!(t.turns[k].prompt_len > prev_end);
                let obs = &t.tokens[prev_end..t.turns[k].prompt_len];
                // The opponent's previous completion, without its EOS, appears verbatim.
                let (theirs, _) = d.agents[1 - a].turn_completion(k - 1);
                let theirs = &theirs[..theirs.len() - 1];
                assert!(obs.windows(theirs.len()).any(|w| w == theirs));
                // The observation opens a user turn and ends by opening an assistant turn; the
                // own EOS was sampled, so it is not repeated.
                assert_eq!(obs[0], '\n' as i64);
                let tail = Chars.encode("<|im_end|>\n<|im_start|>assistant\n").unwrap();
                assert!(obs.ends_with(&tail));
                assert!(t.mask
                    [prev_end - t.first_prompt_len..t.turns[k].prompt_len - t.first_prompt_len]
                    .iter()
                    .all(|&m| m == 0));
            }
        }
    }
}

#[test]
fn the_mock_judge_is_reproducible_by_seed() {
    let seeds: Vec<u64> = (0..16).collect();
    let (a, _) = run(JudgeKind::Mock, &seeds);
    let (b, _) = run(JudgeKind::Mock, &seeds);
    let verdicts = |g: &DebateGroup| g.debates.iter().map(|d| d.verdict).collect::<Vec<_>>();
    assert_eq!(verdicts(&a), verdicts(&b));
    assert!(verdicts(&a).contains(&Some(Verdict::Winner(Side::A))));
    assert!(verdicts(&a).contains(&Some(Verdict::Winner(Side::B))));
}

#[test]
fn a_sampled_judge_that_does_not_answer_in_format_makes_the_debate_invalid() {
    let seeds: Vec<u64> = (0..8).collect();
    let (g, calls) = run(JudgeKind::Policy, &seeds);
    assert_eq!(calls.last(), Some(&(Responder::Policy, 8)));
    let invalid = g.invalid();
    assert!(invalid > 0 && invalid < 8, "{invalid}");
    for d in &g.debates {
        assert!(!d.judge.prompt_tokens.is_empty() && !d.judge.completion_tokens.is_empty());
    }
    // Invalid debates give no datums.
    let data = debate_datums(&g, DebateTrain::Rejection);
    assert_eq!(data.len(), 8 - invalid);
}

#[test]
fn training_modes_match_a_hand_computation() {
    let seeds: Vec<u64> = (20..28).collect();
    let (g, _) = run(JudgeKind::Mock, &seeds);
    let winners: Vec<(usize, usize)> = g
        .debates
        .iter()
        .enumerate()
        .map(|(d, deb)| match deb.verdict {
            Some(Verdict::Winner(s)) => (d, s.index()),
            v => panic!("{v:?}"),
        })
        .collect();
    let sampled = |d: usize, a: usize| {
        g.debates[d].agents[a]
            .mask
            .iter()
            .filter(|&&m| m == 1)
            .count() as f64
    };
    let r1 = |d: usize, a: usize| g.debates[d].r1_scores[a].reward;

    // rejection: 1/T on sampled tokens, 0 (and mask 0) on injected ones.
    let rej = debate_datums(&g, DebateTrain::Rejection);
    for (datum, &(d, w)) in rej.iter().zip(&winners) {
        for (a, m) in datum
            .completion_advantages
            .iter()
            .zip(&datum.completion_mask)
        {
            let want = if *m == 1 { 1.0 / sampled(d, w) } else { 0.0 };
            assert!((*a as f64 - want).abs() < 1e-7);
        }
        assert_eq!(datum.completion_tokens.len(), datum.completion_mask.len());
        assert_eq!(
            datum.completion_tokens.len(),
            datum.completion_logprobs.len()
        );
    }

    // rs_grpo, plain centring: (r - mean over winners) / T.
    let rs = debate_datums(&g, DebateTrain::RsGrpo { std: false });
    let rewards: Vec<f64> = winners.iter().map(|&(d, w)| r1(d, w)).collect();
    let mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
    assert!(
        rewards.iter().any(|&r| r != mean),
        "the scripted answers vary: {rewards:?}"
    );
    for ((datum, &(d, w)), r) in rs.iter().zip(&winners).zip(&rewards) {
        assert_eq!(datum.reward, *r);
        let want = ((r - mean) / sampled(d, w)) as f32;
        for (a, m) in datum
            .completion_advantages
            .iter()
            .zip(&datum.completion_mask)
        {
            assert_eq!(*a, if *m == 1 { want } else { 0.0 });
        }
    }

    // r1_r23: R1 tokens by the z-score over all R1 answers, R2/R3 tokens +-c.
    let c = 0.5;
    let both = debate_datums(&g, DebateTrain::R1R23 { constant: c });
    assert_eq!(both.len(), 2 * winners.len());
    let all: Vec<f64> = winners
        .iter()
        .flat_map(|&(d, w)| [r1(d, w), r1(d, 1 - w)])
        .collect();
    let m = all.iter().sum::<f64>() / all.len() as f64;
    let sd = (all.iter().map(|x| (x - m).powi(2)).sum::<f64>() / all.len() as f64).sqrt();
    for (k, datum) in both.iter().enumerate() {
        let (d, w) = winners[k / 2];
        let agent = if k % 2 == 0 { w } else { 1 - w };
        let t = &g.debates[d].agents[agent];
        let z = if sd == 0.0 {
            0.0
        } else {
            (r1(d, agent) - m) / sd
        } as f32;
        let sign = if k % 2 == 0 { c } else { -c } as f32;
        for (i, (a, mk)) in datum
            .completion_advantages
            .iter()
            .zip(&datum.completion_mask)
            .enumerate()
        {
            let want = if *mk == 0 {
                0.0
            } else if t.turn_positions(0).contains(&i) {
                z
            } else {
                sign
            };
            assert_eq!(*a, want, "datum {k} token {i}");
        }
    }
}
