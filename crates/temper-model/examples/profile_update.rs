//! Time one training forward + backward of a GRPO-shaped batch on a model folder, with and without
//! shared prompts: `cargo run -p temper-model --example profile_update -- DIR [groups n P R]`.
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use temper_model::{position_ids_from_mask, CausalLm, ComputeKind, SharedPrefixRows};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(&args[1]);
    let num = |i: usize, d: i64| args.get(i).map_or(d, |s| s.parse().unwrap());
    let (g, n, p, r) = (num(2, 8), num(3, 8), num(4, 35), num(5, 12));
    let model = CausalLm::load(&dir, Device::Cpu, ComputeKind::F32)?;
    let vocab = model.config().vocab_size;
    let prompts = Tensor::randint(vocab, [g, p], (Kind::Int64, Device::Cpu));
    let rows = Tensor::arange(g, (Kind::Int64, Device::Cpu)).repeat_interleave_self_int(n, 0, None);
    let responses = Tensor::randint(vocab, [g * n, r], (Kind::Int64, Device::Cpu));
    let ids = Tensor::cat(
        &[prompts.index_select(0, &rows), responses.shallow_clone()],
        1,
    );
    let mask = ids.ones_like();
    let pos = position_ids_from_mask(&mask);
    for round in 0..3 {
        let t = Instant::now();
        let targets = ids.roll([-1], [1]);
        let scores = model.token_logprobs(&ids, &mask, &pos, &targets, 1.0);
        let f = t.elapsed().as_secs_f64();
        scores.logp.narrow(1, p - 1, r).sum(Kind::Float).backward();
        scores.backward();
        let full = (f, t.elapsed().as_secs_f64());
        let t = Instant::now();
        let pm = prompts.ones_like();
        let hidden = model.response_hidden_shared(&SharedPrefixRows {
            prompt_ids: &prompts,
            prompt_mask: &pm,
            prompt_positions: &position_ids_from_mask(&pm),
            prompt_of_row: &rows,
            response_ids: &responses,
            response_mask: &responses.ones_like(),
            response_positions: &pos.narrow(1, p, r),
        });
        let scores = model.score_tokens(
            &hidden,
            &responses,
            1.0,
            temper_model::DEFAULT_UNEMBED_CHUNK,
        );
        let f = t.elapsed().as_secs_f64();
        scores.logp.sum(Kind::Float).backward();
        scores.backward();
        let shared = (f, t.elapsed().as_secs_f64());
        println!(
            "round {round}: full fwd {:.2} s, fwd+bwd {:.2} s; shared fwd {:.2} s, fwd+bwd {:.2} s",
            full.0, full.1, shared.0, shared.1
        );
    }
    Ok(())
}
