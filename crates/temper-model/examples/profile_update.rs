//! Time one training forward + backward of a GRPO-shaped batch on a model folder in each layout:
//! padded full rows, padded shared prompts, packed rows, packed shared prompts. Responses have
//! lengths spread over R/4..R (as sampled ones do).
//! `cargo run -p temper-model --example profile_update -- DIR [groups n P R [bf16|f32 [CHUNKS]]]`.
//! With CHUNKS (comma-separated unembedding chunk sizes) only the default layout (packed shared
//! prompts) is timed, once per chunk size.
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use temper_model::{position_ids_from_mask, CausalLm, ComputeKind, SharedPrefixRows};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(&args[1]);
    let num = |i: usize, d: i64| args.get(i).map_or(d, |s| s.parse().unwrap());
    let (g, n, p, r) = (num(2, 8), num(3, 8), num(4, 35), num(5, 12));
    let compute = match args.get(6).map(String::as_str) {
        Some("bf16") => ComputeKind::Bf16,
        _ => ComputeKind::F32,
    };
    let model = CausalLm::load(&dir, Device::Cpu, compute)?;
    let vocab = model.config().vocab_size;
    let prompts = Tensor::randint(vocab, [g, p], (Kind::Int64, Device::Cpu));
    let rows = Tensor::arange(g, (Kind::Int64, Device::Cpu)).repeat_interleave_self_int(n, 0, None);
    let responses = Tensor::randint(vocab, [g * n, r], (Kind::Int64, Device::Cpu));
    // Row i's response is `lens[i]` tokens long, then right padding.
    let lens: Vec<i64> = (0..g * n)
        .map(|i| r / 4 + (i * 37) % (r - r / 4 + 1))
        .collect();
    let response_mask = Tensor::stack(
        &lens
            .iter()
            .map(|&l| {
                Tensor::arange(r, (Kind::Int64, Device::Cpu))
                    .lt(l)
                    .to_kind(Kind::Int64)
            })
            .collect::<Vec<_>>(),
        0,
    );
    let ids = Tensor::cat(
        &[prompts.index_select(0, &rows), responses.shallow_clone()],
        1,
    );
    let mask = Tensor::cat(
        &[
            prompts.index_select(0, &rows).ones_like(),
            response_mask.shallow_clone(),
        ],
        1,
    );
    let pos = position_ids_from_mask(&mask);
    let valid = response_mask.to_kind(Kind::Float);
    let prompt_tokens: Vec<Vec<i64>> = (0..g)
        .map(|k| Vec::<i64>::try_from(prompts.get(k)).unwrap())
        .collect();
    let response_tokens: Vec<Vec<i64>> = (0..g * n)
        .map(|i| Vec::<i64>::try_from(responses.get(i).narrow(0, 0, lens[i as usize])).unwrap())
        .collect();
    let pairs: Vec<(&[i64], &[i64])> = (0..(g * n) as usize)
        .map(|i| {
            (
                prompt_tokens[i / n as usize].as_slice(),
                response_tokens[i].as_slice(),
            )
        })
        .collect();
    let chunk = temper_model::DEFAULT_UNEMBED_CHUNK;
    println!(
        "{g} groups x {n}, prompts {p} tokens, responses {}..{r} (mean {:.0}), {compute:?}",
        r / 4,
        lens.iter().sum::<i64>() as f64 / lens.len() as f64
    );
    let packed = |shared: bool, chunk: i64| {
        let (hidden, _) = model
            .response_hidden_packed(&pairs, r, shared, false)
            .unwrap();
        model.score_tokens(&hidden, &responses, 1.0, chunk)
    };
    if let Some(list) = args.get(7) {
        for round in 0..3 {
            print!("round {round}: ");
            for chunk in list.split(',').map(|c| c.parse::<i64>().unwrap()) {
                time_one(&format!("chunk {chunk}"), &valid, &|| packed(true, chunk));
            }
            println!();
        }
        return Ok(());
    }
    for round in 0..3 {
        print!("round {round}: ");
        time_one("padded", &valid, &|| {
            let hidden = model
                .forward_hidden(&ids, &pos, &mask, None)
                .narrow(1, p - 1, r);
            model.score_tokens(&hidden, &responses, 1.0, chunk)
        });
        time_one("padded shared", &valid, &|| {
            let pm = prompts.ones_like();
            let hidden = model.response_hidden_shared(&SharedPrefixRows {
                prompt_ids: &prompts,
                prompt_mask: &pm,
                prompt_positions: &position_ids_from_mask(&pm),
                prompt_of_row: &rows,
                response_ids: &responses,
                response_mask: &response_mask,
                response_positions: &pos.narrow(1, p, r),
            });
            model.score_tokens(&hidden, &responses, 1.0, chunk)
        });
        for shared in [false, true] {
            let name = if shared { "packed shared" } else { "packed" };
            time_one(name, &valid, &|| packed(shared, chunk));
        }
        println!();
    }
    Ok(())
}

/// Times `run` (the forward) and the backward of the valid tokens' log-probs.
fn time_one<'m>(name: &str, valid: &Tensor, run: &dyn Fn() -> temper_model::TokenScores<'m>) {
    let t = Instant::now();
    let scores = run();
    let f = t.elapsed().as_secs_f64();
    (&scores.logp * valid).sum(Kind::Float).backward();
    scores.backward();
    print!(
        "{name} fwd {f:.2} s, fwd+bwd {:.2} s; ",
        t.elapsed().as_secs_f64()
    );
}
