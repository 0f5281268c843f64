//! `tokenizer.json` and `tokenizer_config.json` from the tokenizer a GGUF file carries in its
//! metadata (`tokenizer.ggml.tokens`, `.token_type`, `.merges`, `.pre`, special ids, chat template).
//!
//! Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE). The pre-tokenizer is chosen from
//! `tokenizer.ggml.pre` as llama.cpp does (its regexes match the original HF releases):
//! - `smollm`, `starcoder`, `refact`: every digit alone, then GPT-2's byte-level split;
//! - `llama-bpe`/`llama3`/... : Llama-3's split regex (and `ignore_merges`, as Llama-3's own file);
//!   `qwen2`/...: Qwen2's (plus Qwen's NFC normalizer);
//! - `gpt-2`, `default` and unknown values: GPT-2's byte-level split (a warning for unknown ones).
//!
//! Control tokens (type 3) become special added tokens and user-defined ones (type 4) plain added
//! tokens, like transformers' GGUF import.

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use super::hf_config::SpecialIds;
use super::reader::{GgufFile, MetaValue};

const TOKEN_CONTROL: i128 = 3;
const TOKEN_USER_DEFINED: i128 = 4;

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The two tokenizer files, plus warnings worth showing the user.
pub struct TokenizerFiles {
    pub tokenizer_json: Value,
    pub tokenizer_config_json: Value,
    pub warnings: Vec<String>,
}

/// GPT-2's reversible byte -> printable character map (`bytes_to_unicode`).
pub fn byte_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable = (b'!' as u32..=b'~' as u32).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        map[b as usize] = char::from_u32(c).expect("valid code point");
    }
    map
}

fn string_array(g: &GgufFile, key: &str) -> Result<Vec<String>> {
    let v = g
        .get(key)
        .with_context(|| format!("metadata '{key}' is missing"))?;
    let arr = v
        .as_array()
        .with_context(|| format!("metadata '{key}' is {}, not an array", v.type_name()))?;
    arr.iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_str().map(str::to_string).with_context(|| {
                format!("metadata '{key}'[{i}] is {}, not a string", x.type_name())
            })
        })
        .collect()
}

fn opt_bool(g: &GgufFile, key: &str) -> Result<Option<bool>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .with_context(|| format!("metadata '{key}' is {}, not a bool", v.type_name())),
    }
}

fn pre_tokenizer(pre: &str, warnings: &mut Vec<String>) -> (Value, Value) {
    let byte_level_regex = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let split = |regex: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]})
    };
    let nfc = json!({"type": "NFC"});
    match pre {
        "smollm" | "starcoder" | "refact" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level_regex]}),
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" | "dbrx" | "pixtral" => {
            (Value::Null, split(LLAMA3_SPLIT))
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" => (nfc, split(QWEN2_SPLIT)),
        "qwen35" => (nfc, split(QWEN35_SPLIT)),
        "gpt-4o" | "llama4" => (Value::Null, split(GPT4O_SPLIT)),
        "gpt-2" | "gpt2" | "default" => (Value::Null, byte_level_regex),
        other => {
            warnings.push(format!(
                "unknown tokenizer.ggml.pre '{other}': using GPT-2's byte-level pre-tokenizer (as transformers does); \
                 check the tokenization against the original model"
            ));
            (Value::Null, byte_level_regex)
        }
    }
}

/// Builds both files. `context` is the model's context length (`model_max_length`).
pub fn tokenizer_files(g: &GgufFile, ids: &SpecialIds, context: usize) -> Result<TokenizerFiles> {
    let model = g
        .get("tokenizer.ggml.model")
        .context("metadata 'tokenizer.ggml.model' is missing (the file carries no tokenizer)")?;
    match model.as_str() {
        Some("gpt2") => {}
        Some(m) => bail!("tokenizer model '{m}' is not supported (only 'gpt2', byte-level BPE)"),
        None => bail!(
            "metadata 'tokenizer.ggml.model' is {}, not a string",
            model.type_name()
        ),
    }
    let mut warnings = Vec::new();
    let spelling = byte_to_unicode();
    let alphabet: std::collections::HashSet<char> = spelling.iter().copied().collect();
    // A token outside the byte alphabet (a llama.cpp mislabel) is respelled byte by byte, as
    // transformers does, so that every vocabulary entry is reachable.
    let tokens: Vec<String> = string_array(g, "tokenizer.ggml.tokens")?
        .into_iter()
        .map(|t| {
            if t.chars().all(|c| alphabet.contains(&c)) {
                t
            } else {
                t.bytes().map(|b| spelling[b as usize]).collect()
            }
        })
        .collect();
    for (name, id) in [
        ("bos", ids.bos),
        ("eos", ids.eos),
        ("eot", ids.eot),
        ("padding", ids.pad),
        ("unknown", ids.unk),
    ] {
        if let Some(i) = id.filter(|&i| i >= tokens.len()) {
            bail!(
                "metadata 'tokenizer.ggml.{name}_token_id' = {i} is outside the {} tokens",
                tokens.len()
            );
        }
    }
    let types: Vec<i128> = match g.get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(MetaValue::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_int().with_context(|| {
                    format!("metadata 'tokenizer.ggml.token_type'[{i}] is not an integer")
                })
            })
            .collect::<Result<_>>()?,
        Some(v) => bail!(
            "metadata 'tokenizer.ggml.token_type' is {}, not an array",
            v.type_name()
        ),
    };
    if types.len() != tokens.len() {
        bail!(
            "metadata 'tokenizer.ggml.token_type' has {} entries for {} tokens",
            types.len(),
            tokens.len()
        );
    }
    let merges: Vec<Value> = string_array(g, "tokenizer.ggml.merges")?
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => Ok(json!([a, b])),
            _ => bail!("metadata 'tokenizer.ggml.merges'[{i}] = {m:?} is not two tokens separated by a space"),
        })
        .collect::<Result<_>>()?;

    let mut vocab = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), json!(i));
    }
    let mut added = Vec::new();
    for (i, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
        if ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty == TOKEN_CONTROL,
            }));
        }
    }

    let pre = match g.get("tokenizer.ggml.pre") {
        None => "default",
        Some(v) => v.as_str().with_context(|| {
            format!(
                "metadata 'tokenizer.ggml.pre' is {}, not a string",
                v.type_name()
            )
        })?,
    };
    let (normalizer, pre_tokenizer) = pre_tokenizer(pre, &mut warnings);
    // Llama-3's tokenizer.json looks whole words up in the vocabulary before merging (llama.cpp
    // does the same for these pre-tokenizer names).
    let ignore_merges = matches!(
        pre,
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral"
    );
    let add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = opt_bool(g, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let token_of = |id: Option<usize>| id.map(|i| tokens[i].clone());
    let post_processor = if add_bos || add_eos {
        template_processing(
            token_of(ids.bos).filter(|_| add_bos).zip(ids.bos),
            token_of(ids.eos).filter(|_| add_eos).zip(ids.eos),
        )
    } else {
        json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
    };

    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
            "vocab": vocab, "merges": merges,
        },
    });
    let mut config = json!({
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": token_of(ids.bos),
        "eos_token": token_of(ids.eos),
        "pad_token": token_of(ids.pad),
        "unk_token": token_of(ids.unk),
        "clean_up_tokenization_spaces": false,
        "model_max_length": context,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    match g.get("tokenizer.chat_template") {
        None => warnings
            .push("the file has no tokenizer.chat_template; chat prompts will need one".into()),
        Some(v) => {
            let t = v.as_str().with_context(|| {
                format!(
                    "metadata 'tokenizer.chat_template' is {}, not a string",
                    v.type_name()
                )
            })?;
            config["chat_template"] = json!(t);
        }
    }
    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config_json: config,
        warnings,
    })
}

/// `bos? $A eos?` (and the same around `$B` for pairs), as HF's Llama-3 tokenizer.json has.
fn template_processing(bos: Option<(String, usize)>, eos: Option<(String, usize)>) -> Value {
    let mut special = Map::new();
    let piece = |seq: &str, type_id: u32| {
        let mut v = Vec::new();
        if let Some((t, _)) = &bos {
            v.push(json!({"SpecialToken": {"id": t, "type_id": type_id}}));
        }
        v.push(json!({"Sequence": {"id": seq, "type_id": type_id}}));
        if let Some((t, _)) = &eos {
            v.push(json!({"SpecialToken": {"id": t, "type_id": type_id}}));
        }
        v
    };
    for (t, id) in bos.iter().chain(eos.iter()) {
        special.insert(t.clone(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    let single = piece("A", 0);
    let mut pair = piece("A", 0);
    pair.extend(piece("B", 1));
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spot values of GPT-2's table: printable ASCII maps to itself, space to 'Ġ' (U+0120),
    /// newline to 'Ċ' (U+010A), 0xAD (soft hyphen) to U+0143.
    #[test]
    fn byte_alphabet_matches_gpt2() {
        let m = byte_to_unicode();
        assert_eq!(m[b'A' as usize], 'A');
        assert_eq!(m[b' ' as usize], '\u{120}');
        assert_eq!(m[b'\n' as usize], '\u{10A}');
        assert_eq!(m[0xAD], '\u{143}');
        assert_eq!(
            m.iter().collect::<std::collections::HashSet<_>>().len(),
            256
        );
    }
}
