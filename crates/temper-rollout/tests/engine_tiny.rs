//! The engine on a tiny random Llama, against transformers (run live from the venv).

mod common;

use common::tiny::{reference, tiny_model};
use temper_model::CausalLm;
use temper_rollout::verify::{compare, trainer_logprobs};
use temper_rollout::{
    Decode, Engine, EngineConfig, Finish, Incoming, LogprobKind, Request, Sample, SamplingParams,
    StopReason,
};

/// Prompts of mixed lengths (1 to 17 tokens).
fn prompts() -> Vec<Vec<i64>> {
    reference().prompts.clone()
}

fn engine(model: &CausalLm, eos: Vec<i64>, max_rows: usize) -> Engine<'_> {
    Engine::new(model, eos).with_config(EngineConfig {
        max_batch_rows: max_rows,
        ..EngineConfig::default()
    })
}

fn run(engine: &Engine, requests: &[Request]) -> Vec<Sample> {
    engine.generate(requests, &mut |_| {}).expect("generate")
}

fn requests(prompts: &[Vec<i64>], params: &SamplingParams) -> Vec<Request> {
    prompts
        .iter()
        .map(|p| Request {
            prompt_ids: p.clone(),
            params: params.clone(),
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn greedy_matches_transformers_generate() {
    let model = tiny_model();
    let ps = prompts();
    let r = &reference().greedy_eos;
    let (eos, want, want_lp) = (r.eos, &r.completions, &r.logprobs);
    // The EOS id really ends some prompts early.
    assert!(
        want.iter().any(|c| c.len() < r.max_new) && want.iter().any(|c| c.len() == r.max_new),
        "{want:?}"
    );
    let params = SamplingParams {
        logprobs: LogprobKind::Raw,
        ..SamplingParams::greedy(r.max_new)
    };
    // All rows at once; then 2 rows at a time, so finished rows are refilled from the queue.
    for max_rows in [64, 2] {
        let samples = run(
            &engine(&model, vec![eos], max_rows),
            &requests(&ps, &params),
        );
        assert_eq!(samples.len(), ps.len());
        for (i, s) in samples.iter().enumerate() {
            assert_eq!((s.request_index, s.sample_index), (i, 0));
            assert_eq!(s.prompt_ids, ps[i]);
            assert_eq!(s.completion_ids, want[i], "prompt {i}, max_rows {max_rows}");
            let stopped = want[i].last() == Some(&eos);
            assert_eq!(
                s.finish,
                if stopped {
                    Finish::Stop
                } else {
                    Finish::Length
                }
            );
            assert_eq!(s.stop_reason, stopped.then_some(StopReason::Eos(eos)));
            let d = max_abs_diff(&s.completion_logprobs, &want_lp[i]);
            assert!(
                d < 1e-4,
                "prompt {i}: logprobs differ from transformers by {d}"
            );
        }
    }
}

#[test]
fn greedy_with_repetition_penalty_and_min_tokens_matches_transformers() {
    let model = tiny_model();
    let ps = prompts();
    let r = &reference().greedy_penalty_min;
    // EOS = the token greedy picks at step 2 for prompt 0: min_tokens must push it back.
    assert_eq!(r.eos, reference().free16[0][1]);
    let params = SamplingParams {
        repetition_penalty: r.repetition_penalty,
        min_tokens: r.min_new_tokens,
        ..SamplingParams::greedy(r.max_new)
    };
    let samples = run(&engine(&model, vec![r.eos], 3), &requests(&ps, &params));
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(s.completion_ids, r.completions[i], "prompt {i}");
        assert!(
            !s.completion_ids[..r.min_new_tokens].contains(&r.eos),
            "EOS inside min_tokens"
        );
    }
    // The penalty really changes the outcome, and so does min_tokens.
    assert_ne!(r.without_penalty, r.completions);
    let no_min = SamplingParams {
        min_tokens: 0,
        repetition_penalty: 1.0,
        ..params
    };
    let s = run(
        &engine(&model, vec![r.eos], 3),
        &requests(&ps[..1], &no_min),
    );
    assert_eq!(s[0].completion_ids.len(), 2);
}

#[test]
fn seeded_samples_do_not_depend_on_the_batch_or_padding() {
    let model = tiny_model();
    let ps = prompts();
    let a = Request {
        prompt_ids: ps[0].clone(), // 1 token: heavily left-padded next to the 17-token prompt
        params: SamplingParams {
            n: 3,
            top_p: 0.9,
            max_tokens: 10,
            seed: Some(7),
            ..Default::default()
        },
    };
    let alone = run(&engine(&model, vec![], 64), std::slice::from_ref(&a));
    let again = run(&engine(&model, vec![], 64), std::slice::from_ref(&a));
    assert_eq!(
        alone, again,
        "same request, same engine settings: bitwise identical"
    );
    let distinct: std::collections::HashSet<_> =
        alone.iter().map(|s| s.completion_ids.clone()).collect();
    assert!(
        distinct.len() > 1,
        "samples of one request should differ: {alone:?}"
    );

    let others = |seed| Request {
        prompt_ids: ps[4].clone(),
        params: SamplingParams {
            n: 2,
            temperature: 0.7,
            top_k: 5,
            max_tokens: 4,
            seed,
            ..Default::default()
        },
    };
    let mixed_batch = vec![others(Some(1)), a.clone(), others(None), others(None)];
    // 64 rows: one batch; 2 rows: `a` is split into units and refilled between other rows.
    for max_rows in [64, 2] {
        let mixed = run(&engine(&model, vec![], max_rows), &mixed_batch);
        let got: Vec<&Sample> = mixed.iter().filter(|s| s.request_index == 1).collect();
        assert_eq!(got.len(), 3);
        let mut worst = 0f64;
        for (g, w) in got.iter().zip(&alone) {
            assert_eq!(g.completion_ids, w.completion_ids, "max_rows {max_rows}");
            let w64: Vec<f64> = w.completion_logprobs.iter().map(|&x| x as f64).collect();
            worst = worst.max(max_abs_diff(&g.completion_logprobs, &w64));
        }
        assert!(worst < 1e-5, "padding/batching moved logprobs by {worst}");
    }
}

#[test]
fn sampled_tokens_follow_the_model_distribution() {
    let model = tiny_model();
    let n = 3000;
    let big = EngineConfig {
        max_batch_rows: n,
        ..EngineConfig::default()
    };
    let cases = &reference().next_probs;
    let scaled = |t: f64| {
        cases
            .iter()
            .find(|c| c.temperature == t && c.top_k < 0 && c.top_p == 1.0)
            .unwrap()
    };
    for case in &cases[..2] {
        let prompt = prompts()[case.prompt_index].clone();
        let (temperature, top_k, top_p) = (case.temperature, case.top_k, case.top_p);
        let params = SamplingParams {
            n,
            temperature,
            top_k,
            top_p,
            max_tokens: 1,
            seed: Some(3),
            ..Default::default()
        };
        let samples = Engine::new(&model, vec![])
            .with_config(big)
            .generate(
                &[Request {
                    prompt_ids: prompt,
                    params,
                }],
                &mut |_| {},
            )
            .unwrap();
        let want = &case.probs;
        let mut counts = vec![0usize; want.len()];
        for s in &samples {
            counts[s.completion_ids[0] as usize] += 1;
        }
        // Tokens transformers removes are never drawn.
        for (t, &c) in counts.iter().enumerate() {
            assert!(
                want[t] > 0.0 || c == 0,
                "token {t} drawn {c} times but removed by transformers"
            );
        }
        let (chi2, df) = chi_square(&counts, want, n);
        let critical = chi2_critical_999(df);
        assert!(
            chi2 < critical,
            "T={temperature} k={top_k} p={top_p}: chi2 {chi2:.1} >= {critical:.1} (df {df})"
        );
        // The reported logprob is log softmax(logits / T), before truncation.
        let scaled = &scaled(temperature).probs;
        for s in samples.iter().take(200) {
            let t = s.completion_ids[0] as usize;
            let d = (s.completion_logprobs[0] as f64 - scaled[t].ln()).abs();
            assert!(
                d < 1e-4,
                "token {t}: logprob {} vs ln p {}",
                s.completion_logprobs[0],
                scaled[t].ln()
            );
        }
    }
}

/// Pearson chi-square over bins with expected count >= 5 (the rest merged into one bin).
fn chi_square(counts: &[usize], probs: &[f64], n: usize) -> (f64, usize) {
    let (mut chi2, mut bins) = (0.0, 0);
    let (mut rest_obs, mut rest_exp) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * n as f64;
        if e >= 5.0 {
            chi2 += (c as f64 - e).powi(2) / e;
            bins += 1;
        } else {
            rest_obs += c as f64;
            rest_exp += e;
        }
    }
    if rest_exp >= 1.0 {
        chi2 += (rest_obs - rest_exp).powi(2) / rest_exp;
        bins += 1;
    }
    (chi2, bins - 1)
}

/// 0.999 quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty).
fn chi2_critical_999(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.090;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// Continuous batching with clients that hang up: a request that is decoding leaves the batch at
/// the next step, one still queued is never admitted, neither is answered, and the request that
/// stays gets the tokens it gets alone.
#[test]
fn requests_whose_client_went_away_stop() {
    let model = tiny_model();
    let ps = prompts();
    let req = |p: usize, n: usize, max_tokens: usize, seed: u64| Request {
        prompt_ids: ps[p].clone(),
        params: SamplingParams {
            n,
            max_tokens,
            ignore_eos: true,
            seed: Some(seed),
            ..Default::default()
        },
    };
    // 4 rows: `long` and `kept` decode together, `queued` waits for free rows.
    let (long, kept, queued) = (req(0, 2, 60, 1), req(4, 2, 20, 2), req(2, 3, 60, 3));
    let steps = std::cell::Cell::new(0usize);
    let mut first = Some(vec![long, kept.clone(), queued]);
    let mut inbox = |idle: bool| {
        steps.set(steps.get() + 1);
        match first.take() {
            Some(all) => Incoming::Requests(all),
            None if idle => Incoming::Close,
            None => Incoming::Requests(vec![]),
        }
    };
    let mut answered = vec![];
    let mut done = |index: usize, r: Result<Vec<Sample>, String>| answered.push((index, r));
    // `long`'s client hangs up after 5 steps, `queued`'s before it is admitted.
    let mut gone = |index: usize| match index {
        0 => steps.get() > 5,
        2 => true,
        _ => false,
    };
    engine(&model, vec![], 4)
        .generate_continuous(&mut inbox, &mut done, &mut gone)
        .unwrap();
    assert_eq!(
        answered.len(),
        1,
        "only the request that stayed is answered"
    );
    let (index, result) = answered.pop().unwrap();
    assert_eq!(index, 1);
    let alone = run(&engine(&model, vec![], 4), &[kept]);
    let got = result.unwrap();
    for (g, a) in got.iter().zip(&alone) {
        assert_eq!(g.completion_ids, a.completion_ids);
    }
    // 20 tokens of `kept` take about 20 steps; `long` alone would have taken 60.
    assert!(
        steps.get() <= 25,
        "the dropped requests kept decoding: {} steps",
        steps.get()
    );
}

#[test]
fn top_k_1_and_tiny_top_p_are_greedy() {
    let model = tiny_model();
    let ps = prompts();
    let greedy = run(
        &engine(&model, vec![], 64),
        &requests(&ps, &SamplingParams::greedy(8)),
    );
    for params in [
        SamplingParams {
            top_k: 1,
            max_tokens: 8,
            seed: Some(1),
            ..Default::default()
        },
        SamplingParams {
            top_p: 1e-6,
            temperature: 1.5,
            max_tokens: 8,
            seed: Some(2),
            ..Default::default()
        },
    ] {
        let got = run(&engine(&model, vec![], 64), &requests(&ps, &params));
        for (g, w) in got.iter().zip(&greedy) {
            assert_eq!(g.completion_ids, w.completion_ids);
        }
    }
}

/// Token `i` decodes to `<i>`: stop strings made of two tokens' text can only match those tokens.
struct Angle;
impl Decode for Angle {
    fn decode(&self, ids: &[i64]) -> anyhow::Result<String> {
        Ok(ids.iter().map(|i| format!("<{i}>")).collect())
    }
}

#[test]
fn stop_strings_stop_tokens_and_lengths() {
    let model = tiny_model();
    let ps = prompts();
    let max = 16;
    let g = &reference().free16[0];
    assert_eq!(g.len(), max);
    // The first position where the pair (g[3], g[4]) ends, at or after index `from`.
    let pair_end = |from: usize| (from.max(1)..g.len()).find(|&j| g[j - 1] == g[3] && g[j] == g[4]);
    let stop = format!("<{}><{}>", g[3], g[4]);
    let decoder = Angle;
    for min_tokens in [0, 6] {
        let params = SamplingParams {
            stop: vec!["<zz>".into(), stop.clone()],
            min_tokens,
            ..SamplingParams::greedy(max)
        };
        let e = engine(&model, vec![], 64).with_decoder(&decoder);
        let s = &run(&e, &requests(&ps[..1], &params))[0];
        // Our semantics: fires on the token that completes it, once the completion has min_tokens.
        match pair_end(min_tokens.saturating_sub(1)) {
            Some(j) => {
                assert_eq!(s.completion_ids, g[..=j], "min_tokens {min_tokens}");
                assert_eq!(
                    (s.finish, s.stop_reason.clone()),
                    (Finish::Stop, Some(StopReason::StopString(1)))
                );
            }
            None => assert_eq!(
                (s.completion_ids.as_slice(), s.finish),
                (g.as_slice(), Finish::Length)
            ),
        }
    }
    // A stop token id ends the sample and is kept; max_tokens gives `length`.
    let params = SamplingParams {
        stop_token_ids: vec![g[5]],
        ..SamplingParams::greedy(max)
    };
    let s = &run(&engine(&model, vec![], 64), &requests(&ps[..1], &params))[0];
    let first = g.iter().position(|&t| t == g[5]).unwrap();
    assert_eq!(s.completion_ids, g[..=first]);
    assert_eq!(s.stop_reason, Some(StopReason::StopToken(g[5])));
    let s = &run(
        &engine(&model, vec![], 64),
        &requests(&ps[..1], &SamplingParams::greedy(3)),
    )[0];
    assert_eq!(
        (s.completion_ids.as_slice(), s.finish, s.stop_reason.clone()),
        (&g[..3], Finish::Length, None)
    );
    // `ignore_eos` keeps going through the model's EOS.
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max)
    };
    let s = &run(
        &engine(&model, vec![g[2]], 64),
        &requests(&ps[..1], &params),
    )[0];
    assert_eq!(&s.completion_ids, g);
}

#[test]
fn sampler_logprobs_agree_with_the_trainer() {
    let model = tiny_model();
    let ps = prompts();
    let params = SamplingParams {
        n: 3,
        temperature: 0.7,
        top_p: 0.9,
        max_tokens: 12,
        seed: Some(11),
        ..Default::default()
    };
    let samples = run(&engine(&model, vec![], 8), &requests(&ps, &params));
    let ours = trainer_logprobs(&model, &samples, 0.7).unwrap();
    let diff = compare(&samples, &ours);
    assert_eq!(
        diff.tokens,
        samples
            .iter()
            .map(|s| s.completion_ids.len())
            .sum::<usize>()
    );
    assert!(diff.max_abs < 1e-5, "sampler vs trainer: {diff:?}");
}

#[test]
fn bad_requests_give_errors_naming_the_field() {
    let model = tiny_model();
    let e = engine(&model, vec![2], 64);
    let err = |r: Request| {
        format!(
            "{:#}",
            e.generate(
                &[
                    Request {
                        prompt_ids: vec![5],
                        params: SamplingParams::greedy(2)
                    },
                    r
                ],
                &mut |_| {}
            )
            .unwrap_err()
        )
    };
    let ok = SamplingParams::greedy(4);
    assert_eq!(
        err(Request {
            prompt_ids: vec![],
            params: ok.clone()
        }),
        "request 1: prompt_ids is empty (a prompt needs at least one token)"
    );
    let long = Request {
        prompt_ids: vec![5; 256],
        params: ok.clone(),
    };
    assert!(err(long).starts_with("request 1: prompt has 256 tokens, the model's context is 256"));
    assert_eq!(
        err(Request {
            prompt_ids: vec![5, 96],
            params: ok.clone()
        }),
        "request 1: prompt_ids[1] = 96 is not a token id (vocabulary size 96)"
    );
    let bad = |p: SamplingParams| {
        err(Request {
            prompt_ids: vec![5],
            params: p,
        })
    };
    assert_eq!(
        bad(SamplingParams {
            top_p: 1.5,
            ..ok.clone()
        }),
        "request 1: top_p = 1.5: must be in (0, 1]"
    );
    assert!(bad(SamplingParams {
        temperature: -1.0,
        ..ok.clone()
    })
    .starts_with("request 1: temperature = -1"));
    assert!(bad(SamplingParams {
        stop_token_ids: vec![500],
        ..ok.clone()
    })
    .starts_with("request 1: stop_token_ids[0] = 500: unknown token id"));
    assert!(bad(SamplingParams {
        stop: vec!["x".into()],
        ..ok.clone()
    })
    .contains("stop strings need a tokenizer"));
    // A prompt one short of the context gets exactly one token.
    let s = run(
        &e,
        &[Request {
            prompt_ids: vec![5; 255],
            params: SamplingParams {
                ignore_eos: true,
                ..ok
            },
        }],
    );
    assert_eq!(
        (s[0].completion_ids.len(), s[0].finish),
        (1, Finish::Length)
    );
}

/// `Engine::with_kv_recompute`: new weights copied in from the inbox between two steps (the
/// policy version bumped) reach the rows in flight with their cache recomputed, so every token
/// drawn after the change has the logprob the trainer's teacher-forced forward of the new
/// weights gives it; the same run keeping the old weights' cache (partial rollouts' default)
/// does not.
#[test]
fn recomputing_the_cache_after_new_weights_draws_from_the_new_policy_alone() {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};
    let run_with = |recompute: bool| -> (f64, usize) {
        let model = tiny_model();
        tch::manual_seed(11);
        let newer: Vec<(tch::Tensor, tch::Tensor)> = tch::no_grad(|| {
            model
                .named_parameters()
                .into_iter()
                .map(|(_, p)| {
                    let w = &p + p.randn_like() * 0.05;
                    (p, w)
                })
                .collect()
        });
        let version = AtomicU64::new(0);
        let params = SamplingParams {
            max_tokens: 24,
            min_tokens: 24,
            seed: Some(5),
            ..SamplingParams::default()
        };
        let mut first = Some(requests(&prompts()[..3], &params));
        let (calls, left) = (Cell::new(0), Cell::new(3));
        let mut inbox = |_idle: bool| {
            calls.set(calls.get() + 1);
            // After 8 tokens of every row: the new weights, as a trainer's update would bring.
            if calls.get() == 9 {
                tch::no_grad(|| {
                    for (p, w) in &newer {
                        p.shallow_clone().copy_(w);
                    }
                });
                model.thaw_after_sampling();
                model.freeze_for_sampling();
                version.store(1, Ordering::SeqCst);
            }
            match first.take() {
                Some(all) => Incoming::Requests(all),
                None if left.get() == 0 => Incoming::Close,
                None => Incoming::Requests(vec![]),
            }
        };
        let mut samples = vec![];
        let mut done = |_: usize, r: Result<Vec<Sample>, String>| {
            samples.extend(r.unwrap());
            left.set(left.get() - 1);
        };
        engine(&model, vec![], 8)
            .with_policy_version(&version)
            .with_kv_recompute(recompute)
            .generate_continuous(&mut inbox, &mut done, &mut |_| false)
            .unwrap();
        // The trainer's recomputation under the new weights (the model holds them now).
        let want = trainer_logprobs(&model, &samples, 1.0).unwrap();
        let (mut worst, mut after) = (0.0f64, 0);
        for (s, w) in samples.iter().zip(&want) {
            assert_eq!(s.completion_versions.len(), 24);
            assert_eq!(s.completion_versions[0], 0);
            for ((&v, &got), &wanted) in s
                .completion_versions
                .iter()
                .zip(&s.completion_logprobs)
                .zip(w)
            {
                if v == 1 {
                    after += 1;
                    worst = worst.max((got as f64 - wanted as f64).abs());
                }
            }
        }
        (worst, after)
    };
    let (recomputed, after) = run_with(true);
    assert!(after >= 3 * 10, "{after} tokens after the change");
    assert!(recomputed < 2e-4, "recomputed cache: {recomputed}");
    let (kept, _) = run_with(false);
    eprintln!("{after} tokens after the change: recomputed {recomputed:e}, kept {kept:e}");
    assert!(
        kept > 1e-3,
        "kept cache: {kept} (the old weights' keys should show)"
    );
}
