//! Dequantization of ggml block formats to f32.
//!
//! Each function follows the block layout of ggml-quants.c and, for bit-exact results, the same
//! order of f32 operations as the reference `gguf.quants` (Python) package, e.g. Q4_1 is
//! `(d * q) + m` and Q4_K is `(d * sc) * q - (dmin * m)`. Rust never fuses these into FMAs.

use anyhow::{bail, Result};
use half::{bf16, f16};

use super::types::GgmlType;

/// Dequantizes `n` elements of type `ty` from `bytes` (exactly `n / block * block_bytes` long).
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    let Some((block, size)) = ty.block_geometry() else {
        bail!("unsupported ggml type {ty}");
    };
    if !n.is_multiple_of(block) || bytes.len() != n / block * size {
        bail!(
            "{ty}: {} bytes do not hold {n} elements ({block} per {size}-byte block)",
            bytes.len()
        );
    }
    let mut out = vec![0f32; n];
    let blocks = bytes.chunks_exact(size).zip(out.chunks_exact_mut(block));
    match ty {
        GgmlType::F32 => {
            blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = half(b, 0)),
        GgmlType::BF16 => blocks
            .for_each(|(b, y)| y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        GgmlType::Q2_K => blocks.for_each(|(b, y)| q2_k(b, y)),
        GgmlType::Q3_K => blocks.for_each(|(b, y)| q3_k(b, y)),
        GgmlType::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5_K => blocks.for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
        _ => unreachable!("block_geometry covers exactly the types matched here"),
    }
    Ok(out)
}

/// The little-endian f16 at byte `at`, widened to f32.
fn half(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Nibble `j` (0..32) of a 32-element block: low nibbles hold elements 0..16, high nibbles 16..32.
fn nibble(qs: &[u8], j: usize) -> u8 {
    (qs[j % 16] >> (4 * (j / 16))) & 0x0F
}

/// Block: f16 d, 16 bytes of 4-bit q. x = d * (q - 8).
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (j, y) in y.iter_mut().enumerate() {
        *y = d * (nibble(&b[2..], j) as i8 - 8) as f32;
    }
}

/// Block: f16 d, f16 m, 16 bytes of 4-bit q. x = d * q + m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, y) in y.iter_mut().enumerate() {
        *y = d * nibble(&b[4..], j) as f32 + m;
    }
}

/// Block: f16 d, u32 high bits, 16 bytes of low nibbles. x = d * (q - 16).
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, y) in y.iter_mut().enumerate() {
        let q = nibble(&b[6..], j) | ((((qh >> j) & 1) as u8) << 4);
        *y = d * (q as i8 - 16) as f32;
    }
}

/// Block: f16 d, f16 m, u32 high bits, 16 bytes of low nibbles. x = d * q + m.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, y) in y.iter_mut().enumerate() {
        let q = nibble(&b[8..], j) | ((((qh >> j) & 1) as u8) << 4);
        *y = d * q as f32 + m;
    }
}

/// Block: f16 d, 32 int8 q. x = d * q.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (j, y) in y.iter_mut().enumerate() {
        *y = d * (b[2 + j] as i8) as f32;
    }
}

/// Super-block of 256: 16 bytes of 4-bit (scale, min) pairs, 64 bytes of 2-bit q, f16 d, f16 dmin.
/// Element e = 128c + 32j + l takes bits 2j of qs[32c + l]; sub-block e / 16.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (half(b, 80), half(b, 82));
    for (e, y) in y.iter_mut().enumerate() {
        let (c, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let q = (qs[32 * c + l] >> (2 * j)) & 3;
        let sc = scales[e / 16];
        let dl = d * (sc & 0x0F) as f32;
        let ml = dmin * (sc >> 4) as f32;
        *y = dl * q as f32 - ml;
    }
}

/// Super-block of 256: 32 bytes of high-bit mask, 64 bytes of 2-bit q, 12 bytes of 6-bit signed
/// scales, f16 d. Element e = 128c + 32j + l: low bits 2j of qs[32c + l], high bit (4c + j) of
/// hmask[l] (a set bit means no -4 offset).
fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = half(b, 108);
    let scale = |s: usize| -> f32 {
        let low = if s < 8 { sc[s] & 0x0F } else { sc[s - 8] >> 4 };
        let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        ((low | (high << 4)) as i8 - 32) as f32
    };
    for (e, y) in y.iter_mut().enumerate() {
        let (c, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ((qs[32 * c + l] >> (2 * j)) & 3) as i8;
        let high_set = (hmask[l] >> (4 * c + j)) & 1 == 1;
        let q = low - if high_set { 0 } else { 4 };
        *y = (d * scale(e / 16)) * q as f32;
    }
}

/// The 6-bit (scale, min) of sub-block `s` (0..8) packed in 12 bytes (ggml's `get_scale_min_k4`).
fn scale_min_k4(s: usize, sc: &[u8]) -> (u8, u8) {
    if s < 4 {
        (sc[s] & 63, sc[s + 4] & 63)
    } else {
        (
            (sc[s + 4] & 0x0F) | ((sc[s - 4] >> 6) << 4),
            (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4),
        )
    }
}

/// Super-block of 256: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of 4-bit q.
/// Element e = 64c + 32h + l takes nibble h of qs[32c + l]; sub-block 2c + h.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let (sc, qs) = (&b[4..16], &b[16..144]);
    for (e, y) in y.iter_mut().enumerate() {
        let (c, h, l) = (e / 64, (e % 64) / 32, e % 32);
        let q = (qs[32 * c + l] >> (4 * h)) & 0x0F;
        let (s, m) = scale_min_k4(2 * c + h, sc);
        *y = (d * s as f32) * q as f32 - dmin * m as f32;
    }
}

/// Super-block of 256: as Q4_K plus 32 bytes of fifth bits: bit s of qh[l] for sub-block s.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let (sc, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for (e, y) in y.iter_mut().enumerate() {
        let (c, h, l) = (e / 64, (e % 64) / 32, e % 32);
        let s = 2 * c + h;
        let q = ((qs[32 * c + l] >> (4 * h)) & 0x0F) | (((qh[l] >> s) & 1) << 4);
        let (scale, m) = scale_min_k4(s, sc);
        *y = (d * scale as f32) * q as f32 - dmin * m as f32;
    }
}

/// Super-block of 256: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, f16 d.
/// Element e = 128c + r: low nibble (r / 64) of ql[64c + r % 64], high bits 2(r / 32) of
/// qh[32c + r % 32]; q is 6-bit minus 32; scale e / 16.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    for (e, y) in y.iter_mut().enumerate() {
        let (c, r) = (e / 128, e % 128);
        let low = (ql[64 * c + r % 64] >> (4 * (r / 64))) & 0x0F;
        let high = (qh[32 * c + r % 32] >> (2 * (r / 32))) & 3;
        let q = (low | (high << 4)) as i8 - 32;
        *y = (d * scales[e / 16] as i8 as f32) * q as f32;
    }
}
