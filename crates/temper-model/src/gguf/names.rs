//! llama.cpp tensor names -> Hugging Face (Llama/Qwen2/Qwen3) names, and the Q/K row permutation
//! llama.cpp's converter applies to `llama`-architecture files.

use anyhow::{bail, Result};

/// The HF name of a GGUF tensor, or an error for a tensor the decoder has no place for.
pub fn hf_name(gguf: &str) -> Result<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        "rope_freqs.weight" => bail!(
            "tensor 'rope_freqs.weight' (Llama-3.1-style rope scaling) is not supported by the decoder"
        ),
        _ => None,
    };
    if let Some(name) = fixed {
        return Ok(name.to_string());
    }
    let Some(rest) = gguf.strip_prefix("blk.") else {
        bail!("tensor '{gguf}' has no Llama/Qwen2/Qwen3 counterpart");
    };
    let Some((layer, part)) = rest.split_once('.') else {
        bail!("tensor '{gguf}' has no Llama/Qwen2/Qwen3 counterpart");
    };
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        bail!("tensor '{gguf}': '{layer}' is not a layer number");
    }
    let Some((module, suffix)) = part.split_once('.') else {
        bail!("tensor '{gguf}' has no Llama/Qwen2/Qwen3 counterpart");
    };
    let hf_module = match module {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => bail!("tensor '{gguf}': unknown module '{module}' for a Llama/Qwen2/Qwen3 decoder"),
    };
    if suffix != "weight" && suffix != "bias" {
        bail!("tensor '{gguf}': unknown suffix '{suffix}'");
    }
    Ok(format!(
        "model.layers.{}.{hf_module}.{suffix}",
        layer.parse::<u64>()?
    ))
}

/// Undoes llama.cpp's `permute` of Q/K projection rows (weights or biases) in place.
///
/// llama.cpp (`convert_hf_to_gguf.py`, `LlamaModel.permute`) stores
/// `w.reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2)`, i.e. it interleaves the two rotary
/// halves of every head. The inverse is `w.reshape(n_head, rows/n_head/2, 2, cols).swapaxes(1, 2)`:
/// output row `h*2d + a*d + i` is input row `h*2d + 2i + a` for `a in {0,1}`, `i < d`.
/// `n_head` is the number of heads the rows belong to (KV heads for K).
pub fn unpermute_rows(data: &mut [f32], rows: usize, cols: usize, n_head: usize) -> Result<()> {
    if n_head == 0 || !rows.is_multiple_of(2 * n_head) || data.len() != rows * cols {
        bail!("cannot undo the Q/K permutation: {rows} rows x {cols} cols for {n_head} heads");
    }
    let d = rows / n_head / 2;
    let src = data.to_vec();
    for h in 0..n_head {
        for a in 0..2 {
            for i in 0..d {
                let out = h * 2 * d + a * d + i;
                let inp = h * 2 * d + 2 * i + a;
                data[out * cols..(out + 1) * cols]
                    .copy_from_slice(&src[inp * cols..(inp + 1) * cols]);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_layer_names() {
        assert_eq!(
            hf_name("blk.12.attn_q.bias").unwrap(),
            "model.layers.12.self_attn.q_proj.bias"
        );
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight").unwrap(),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(hf_name("output.weight").unwrap(), "lm_head.weight");
        assert!(hf_name("blk.x.attn_q.weight").is_err());
        assert!(hf_name("blk.1.ffn_gate_exps.weight").is_err());
        assert!(hf_name("rope_freqs.weight").is_err());
    }

    /// The inverse of the forward permutation written out independently, as llama.cpp's reshape:
    /// forward output row (h, i, a) = input row (h, a, i).
    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (n_head, d, cols) = (3, 4, 2);
        let rows = n_head * 2 * d;
        let hf: Vec<f32> = (0..rows * cols).map(|x| x as f32).collect();
        let mut gguf = vec![0.0; rows * cols];
        for h in 0..n_head {
            for i in 0..d {
                for a in 0..2 {
                    let dst = (h * d + i) * 2 + a;
                    let src = (h * 2 + a) * d + i;
                    gguf[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        assert_ne!(gguf, hf);
        unpermute_rows(&mut gguf, rows, cols, n_head).unwrap();
        assert_eq!(gguf, hf);
    }
}
