#!/usr/bin/env python3
"""Writes the GGUF reader/dequantization fixtures for crates/temper-model/tests/gguf_dequant.rs.

    .venv/bin/python tools/gguf_make_fixtures.py [OUT_DIR]   # default crates/temper-model/tests/fixtures/gguf

Outputs (small, committed):
- quants.gguf: one tensor per ggml type we dequantize, a 3-D tensor, metadata of every GGUF value
  type (arrays, a nested array), and a custom alignment of 64, written by the `gguf` package's
  GGUFWriter (the reference writer).
- quants_expected.f32: the reference dequantization (`gguf.quants.dequantize`) of each tensor,
  little-endian f32, concatenated; quants_expected.json: per tensor name, type, shape and offset,
  plus the metadata the file holds (type name and value).

Tensors come in two kinds: `q.TYPE` is random normal data quantized with `gguf.quants.quantize`
(where the package can quantize that type); `r.TYPE` is random block bytes with the f16 scale
fields replaced by finite random values, so every bit pattern of the quants is exercised (the
K-quants, which the package cannot quantize, only come this way).
"""

import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

ROWS, COLS = 2, 512
# Byte offsets of the f16 scale fields inside one block, per type (ggml-common.h block layouts).
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def random_blocks(rng: np.random.Generator, qtype: T, rows: int, cols: int) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        scale = (rng.uniform(0.001, 0.1, n_blocks) * rng.choice([-1.0, 1.0], n_blocks)).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, cols // block * size)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "crates/temper-model/tests/fixtures/gguf"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240611)

    w = gguf.GGUFWriter(out / "quants.gguf", arch="fixture")
    w.add_custom_alignment(64)
    meta = {
        "general.architecture": ("string", "fixture"),
        "general.alignment": ("uint32", 64),
    }

    def kv(key, value, vtype, name):
        w.add_key_value(key, value, vtype)
        meta[key] = (name, value)

    V = gguf.GGUFValueType
    kv("t.u8", 200, V.UINT8, "uint8")
    kv("t.i8", -100, V.INT8, "int8")
    kv("t.u16", 60000, V.UINT16, "uint16")
    kv("t.i16", -30000, V.INT16, "int16")
    kv("t.u32", 4000000000, V.UINT32, "uint32")
    kv("t.i32", -2000000000, V.INT32, "int32")
    kv("t.f32", float(np.float32(0.1)), V.FLOAT32, "float32")
    kv("t.bool", True, V.BOOL, "bool")
    kv("t.str", "héllo wörld ✓", V.STRING, "string")
    kv("t.u64", 2**63 + 5, V.UINT64, "uint64")
    kv("t.i64", -(2**62), V.INT64, "int64")
    kv("t.f64", 2.718281828459045, V.FLOAT64, "float64")
    kv("t.arr_i32", [1, -2, 3], V.ARRAY, "array")
    kv("t.arr_str", ["a", "", "ü b"], V.ARRAY, "array")
    kv("t.arr_f32", [0.5, -1.25], V.ARRAY, "array")
    kv("t.arr_nested", [[1, 2], [3]], V.ARRAY, "array")

    tensors = []  # (name, qtype, raw array, element shape)
    for qtype in QUANTIZABLE:
        data = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        raw = gguf.quants.quantize(data, qtype)
        tensors.append((f"q.{qtype.name}", qtype, raw, (ROWS, COLS)))
    for qtype in F16_FIELDS:
        tensors.append((f"r.{qtype.name}", qtype, random_blocks(rng, qtype, ROWS, COLS), (ROWS, COLS)))
    three_d = rng.standard_normal((2, 3, 32)).astype(np.float32)
    tensors.append(("three_d", T.F32, three_d, three_d.shape))

    expected, index, offset = [], [], 0
    for name, qtype, raw, shape in tensors:
        if qtype in (T.F32, T.F16):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        ref = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(shape)
        assert np.isfinite(ref).all(), name
        expected.append(ref.ravel())
        index.append({"name": name, "type": qtype.name, "type_id": int(qtype), "shape": list(shape), "offset": offset, "count": int(ref.size)})
        offset += int(ref.size)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    np.concatenate(expected).astype("<f4").tofile(out / "quants_expected.f32")
    manifest = {
        "tensors": index,
        "metadata": {k: {"type": t, "value": v} for k, (t, v) in meta.items()},
    }
    (out / "quants_expected.json").write_text(json.dumps(manifest, indent=1) + "\n")

    # Cross-check the file with the package's own reader.
    r = gguf.GGUFReader(out / "quants.gguf")
    assert r.alignment == 64 and len(r.tensors) == len(tensors)
    print(f"wrote {out}: {len(tensors)} tensors, {offset} expected values")


if __name__ == "__main__":
    main()
