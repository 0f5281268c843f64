//! Where a decode step's time goes: the layers (with the cache), the head, and drawing the tokens
//! with their logprobs, for SmolLM2-135M at 16 rows after a 128-token prefill, one thread.
//!
//! ```text
//! cargo run -p temper-rollout --example profile_decode            # N=20 steps, DTYPE=f32
//! N=60 DTYPE=bf16 cargo run -p temper-rollout --example profile_decode
//! ```
//! A diagnostic, not a benchmark: `temper bench sample` compares with transformers.
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, ComputeKind};
use temper_rollout::params::SamplingParams;
use temper_rollout::sample_step::{sample_step, RowView};

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let steps: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dtype: ComputeKind = std::env::var("DTYPE").unwrap_or("f32".into()).parse()?;
    let dir = temper_model::resolve::resolve_model("smollm2")?;
    let model = CausalLm::load(&dir, Device::Cpu, dtype)?;
    let (rows, past) = (16i64, 128i64);
    let cpu_ids = (Kind::Int64, Device::Cpu);
    let _no_grad = tch::no_grad_guard();
    model.with_sampling_weights(|| {
        let mut cache = model.new_cache();
        let ids = Tensor::randint(1000, [rows, past], cpu_ids);
        let mut mask = Tensor::ones([rows, past], cpu_ids);
        let pos = Tensor::arange(past, cpu_ids).unsqueeze(0).repeat([rows, 1]);
        let _ = model.forward_hidden(&ids, &pos, &mask, Some(&mut cache));
        let params = SamplingParams::default();
        let views: Vec<RowView> = (0..rows)
            .map(|_| RowView {
                params: &params,
                banned: &[],
                seen: &[],
            })
            .collect();
        let keys: Vec<u64> = (0..rows as u64).collect();
        let (mut layers, mut head, mut sample) = (0.0, 0.0, 0.0);
        for i in 0..steps {
            let ids = Tensor::randint(1000, [rows, 1], cpu_ids);
            mask = Tensor::cat(&[&mask, &Tensor::ones([rows, 1], cpu_ids)], 1);
            let pos = Tensor::full([rows, 1], past + i as i64, cpu_ids);
            let t0 = Instant::now();
            let hidden = model.forward_hidden(&ids, &pos, &mask, Some(&mut cache));
            let t1 = Instant::now();
            let logits = model.logits(&hidden.select(1, -1));
            let t2 = Instant::now();
            sample_step(&logits, &views, &keys)?;
            let t3 = Instant::now();
            layers += (t1 - t0).as_secs_f64();
            head += (t2 - t1).as_secs_f64();
            sample += (t3 - t2).as_secs_f64();
        }
        let ms = |t: f64| t / steps as f64 * 1e3;
        println!(
            "{dtype}, {:?} weights, per decode step of {rows} rows: layers {:.1} ms, head {:.1} ms, \
             sample {:.1} ms",
            model.sampling_weights_layout().unwrap_or("plain"),
            ms(layers),
            ms(head),
            ms(sample)
        );
        Ok(())
    })
}
