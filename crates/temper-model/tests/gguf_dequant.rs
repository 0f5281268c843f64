//! The GGUF reader and dequantization against fixtures written by the reference `gguf` Python
//! package (tools/gguf_make_fixtures.py): every supported ggml type bit-exact against
//! `gguf.quants.dequantize`, every metadata value type, and corrupt/truncated files as errors.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use temper_model::gguf::{dequantize, GgmlType, GgufFile, MetaValue};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("quants_expected.json")).unwrap())
        .unwrap()
}

fn expected_values() -> Vec<f32> {
    std::fs::read(fixtures().join("quants_expected.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A scratch folder unique to this test process and `name`.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("temper-gguf-dequant-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn every_type_dequantizes_like_the_reference() {
    let g = GgufFile::open(&fixtures().join("quants.gguf")).unwrap();
    let expected = expected_values();
    let m = manifest();
    let entries = m["tensors"].as_array().unwrap();
    let mut types_seen = std::collections::HashSet::new();
    for e in entries {
        let name = e["name"].as_str().unwrap();
        let t = g
            .tensor(name)
            .unwrap_or_else(|| panic!("tensor {name} missing"));
        assert_eq!(
            t.ggml_type.0 as u64,
            e["type_id"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            t.ggml_type.name().unwrap(),
            e["type"].as_str().unwrap(),
            "{name}"
        );
        let shape: Vec<usize> = e["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(t.shape(), shape, "{name}");
        let (off, n) = (
            e["offset"].as_u64().unwrap() as usize,
            e["count"].as_u64().unwrap() as usize,
        );
        let got = g.tensor_f32(t).unwrap();
        let want = &expected[off..off + n];
        assert_eq!(got.len(), n, "{name}");
        let mismatches: Vec<usize> = (0..n)
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .collect();
        assert!(
            mismatches.is_empty(),
            "{name}: {} of {n} values differ, first at {}: got {} want {}",
            mismatches.len(),
            mismatches[0],
            got[mismatches[0]],
            want[mismatches[0]]
        );
        types_seen.insert(t.ggml_type);
    }
    for t in GgmlType::SUPPORTED {
        assert!(types_seen.contains(&t), "no fixture for supported type {t}");
    }
}

fn to_json(v: &MetaValue) -> (String, Value) {
    let value = match v {
        MetaValue::String(s) => json!(s),
        MetaValue::Bool(b) => json!(b),
        MetaValue::F32(x) => json!(*x as f64),
        MetaValue::F64(x) => json!(x),
        MetaValue::Array(a) => Value::Array(a.iter().map(|x| to_json(x).1).collect()),
        MetaValue::U64(x) => json!(x),
        other => json!(other.as_int().unwrap() as i64),
    };
    (v.type_name().to_string(), value)
}

#[test]
fn metadata_of_every_type_reads_back() {
    let g = GgufFile::open(&fixtures().join("quants.gguf")).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 64);
    assert_eq!(g.data_offset % 64, 0);
    let m = manifest();
    let want = m["metadata"].as_object().unwrap();
    assert_eq!(g.metadata.len(), want.len());
    for (key, w) in want {
        let v = g
            .get(key)
            .unwrap_or_else(|| panic!("metadata {key} missing"));
        let (ty, value) = to_json(v);
        assert_eq!(ty, w["type"].as_str().unwrap(), "{key}");
        assert_eq!(value, w["value"], "{key}");
    }
    // The nested array keeps its structure.
    let nested = g.get("t.arr_nested").unwrap().as_array().unwrap();
    assert_eq!(nested[0].as_array().unwrap().len(), 2);
}

fn patched(name: &str, f: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(fixtures().join("quants.gguf")).unwrap();
    f(&mut bytes);
    let p = scratch("patched").join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn version_2_reads_and_others_are_refused() {
    let v2 = patched("v2.gguf", |b| b[4..8].copy_from_slice(&2u32.to_le_bytes()));
    let g = GgufFile::open(&v2).unwrap();
    assert_eq!(g.version, 2);
    assert_eq!(
        g.tensors.len(),
        manifest()["tensors"].as_array().unwrap().len()
    );

    type Patch = Box<dyn FnOnce(&mut Vec<u8>)>;
    let cases: [(&str, Patch, &str); 4] = [
        (
            "v1.gguf",
            Box::new(|b| b[4..8].copy_from_slice(&1u32.to_le_bytes())),
            "version 1",
        ),
        (
            "v9.gguf",
            Box::new(|b| b[4..8].copy_from_slice(&9u32.to_le_bytes())),
            "version 9",
        ),
        (
            "be.gguf",
            Box::new(|b| b[4..8].copy_from_slice(&3u32.to_be_bytes())),
            "big-endian",
        ),
        (
            "magic.gguf",
            Box::new(|b| b[0..4].copy_from_slice(b"GGML")),
            "not a GGUF file",
        ),
    ];
    for (name, f, msg) in cases {
        let p = patched(name, f);
        let err = format!(
            "{:#}",
            GgufFile::open(&p)
                .err()
                .unwrap_or_else(|| panic!("{name} opened"))
        );
        assert!(err.contains(msg) && err.contains(name), "{name}: {err}");
        assert!(!err.contains('\n'), "{name}: multi-line error {err}");
    }
}

#[test]
fn truncated_files_are_errors_naming_the_file() {
    let full = std::fs::read(fixtures().join("quants.gguf")).unwrap();
    let g = GgufFile::open(&fixtures().join("quants.gguf")).unwrap();
    // The last tensor's data end: any cut before it must fail.
    let needed = g
        .tensors
        .iter()
        .map(|t| g.data_offset + t.offset + t.n_bytes().unwrap())
        .max()
        .unwrap() as usize;
    let dir = scratch("truncated");
    let mut cuts: Vec<usize> = (0..needed).step_by(61).collect();
    cuts.extend([0, 3, 4, 7, 8, 23, needed - 1]);
    for cut in cuts {
        let p = dir.join(format!("cut{cut}.gguf"));
        std::fs::write(&p, &full[..cut]).unwrap();
        let err = GgufFile::open(&p)
            .err()
            .unwrap_or_else(|| panic!("a file cut at {cut} of {needed} bytes opened"));
        let msg = format!("{err:#}");
        assert!(msg.contains(&p.display().to_string()), "cut {cut}: {msg}");
        assert!(
            msg.contains("truncated")
                || msg.contains("not a GGUF")
                || msg.contains("corrupt count"),
            "cut {cut}: {msg}"
        );
    }
}

#[test]
fn corrupt_headers_never_panic() {
    let full = std::fs::read(fixtures().join("quants.gguf")).unwrap();
    let header_len = GgufFile::open(&fixtures().join("quants.gguf"))
        .unwrap()
        .data_offset as usize;
    let dir = scratch("corrupt");
    let mut state = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut errors = 0;
    for i in 0..300 {
        let mut bytes = full.clone();
        for _ in 0..1 + i % 3 {
            let at = 8 + (next() as usize) % (header_len - 8);
            bytes[at] = next() as u8;
        }
        let p = dir.join(format!("c{i}.gguf"));
        std::fs::write(&p, &bytes).unwrap();
        // Either outcome is fine; a panic or abort (e.g. a huge allocation) is not.
        if let Ok(g) = GgufFile::open(&p) {
            for t in &g.tensors {
                let _ = g.tensor_f32(t);
            }
        } else {
            errors += 1;
        }
    }
    assert!(errors > 0, "no corruption was detected at all");
}

#[test]
fn dequantize_checks_type_and_length() {
    let err = dequantize(GgmlType(16), &[0; 66], 256)
        .unwrap_err()
        .to_string();
    assert!(err.contains("IQ2_XXS"), "{err}");
    let err = dequantize(GgmlType::Q8_0, &[0; 33], 32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("33 bytes"), "{err}");
    assert!(dequantize(GgmlType::Q4_K, &[0; 144], 255).is_err());
}
