//! `temper convert FILE.gguf OUT_DIR`: GGUF -> HF folder (f32 safetensors, config, tokenizer).
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (llama, qwen2 or qwen3 architecture; F32/F16/BF16, Q4_0..Q8_0, Q2_K..Q6_K tensors).
    pub gguf: PathBuf,
    /// The folder to write (created if needed): model.safetensors, config.json, generation_config.json,
    /// tokenizer.json, tokenizer_config.json.
    pub out_dir: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let report = temper_model::gguf::convert_gguf(&args.gguf, &args.out_dir)?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    println!(
        "converted {} ({:?}, {} tensors, {} parameters) -> {}",
        args.gguf.display(),
        report.arch,
        report.n_tensors,
        report.n_params,
        args.out_dir.display()
    );
    Ok(())
}
