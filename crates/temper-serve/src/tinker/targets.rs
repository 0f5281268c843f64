//! `target_prompt_logprobs`: the SDK's int64 `[len(prompt) - 1, K]` tensor of token ids (dense,
//! `-1` for "nothing", or sparse CSR listing only the requested cells), read from the sample
//! request's JSON, and the float32 answer in the same layout and shape (0.0 where nothing was
//! asked).

use anyhow::{bail, Result};
use serde_json::Value;
use temper_tinker::TargetCell;

use super::proto;

/// A parsed `target_prompt_logprobs`: the cells to score and how to lay out their answers.
#[derive(Debug)]
pub struct TargetRequest {
    rows: usize,
    k: usize,
    layout: Layout,
    /// The requested cells, in the tensor's order (row-major; CSR order for sparse).
    pub cells: Vec<TargetCell>,
}

#[derive(Debug)]
enum Layout {
    /// Per dense entry (row-major), whether it was requested (not `-1`).
    Dense(Vec<bool>),
    /// The request's CSR structure (kept for the answer) and, per listed value, whether it was
    /// requested (a listed `-1` asks nothing).
    Sparse {
        crow: Vec<i64>,
        col: Vec<i64>,
        asked: Vec<bool>,
    },
}

const FIELD: &str = "target_prompt_logprobs";

/// Reads `v` (a `TensorData` as the SDK sends it in JSON) for a prompt of `prompt_len` tokens and
/// a vocabulary of `vocab` ids. Every allocation is sized by lists the body itself holds.
pub fn parse(v: &Value, prompt_len: usize, vocab: i64) -> Result<TargetRequest> {
    if v["dtype"].as_str() != Some("int64") {
        bail!(
            "{FIELD}.dtype: {} must be \"int64\" (token ids)",
            v["dtype"]
        );
    }
    let shape = ints(&v["shape"], "shape")?;
    let rows = prompt_len.saturating_sub(1);
    let [r, k] = shape[..] else {
        bail!("{FIELD}.shape: {shape:?} must be [len(prompt) - 1, K] = [{rows}, K]");
    };
    if r != rows as i64 || k < 0 {
        bail!("{FIELD}.shape: {shape:?} must be [len(prompt) - 1, K] = [{rows}, K]");
    }
    let k = k as usize;
    let data = ints(&v["data"], "data")?;
    let token = |i: usize, row: usize, col: usize, t: i64| -> Result<Option<TargetCell>> {
        match t {
            -1 => Ok(None),
            t if t >= 0 && t < vocab => Ok(Some(TargetCell { row, token: t })),
            t => bail!(
                "{FIELD}.data[{i}] (row {row}, column {col}) = {t}: a token id must be -1 (nothing) or in 0..{vocab}"
            ),
        }
    };
    let mut cells = vec![];
    let layout = match (&v["sparse_crow_indices"], &v["sparse_col_indices"]) {
        (Value::Null, Value::Null) => {
            if Some(data.len()) != rows.checked_mul(k) {
                bail!(
                    "{FIELD}.data: {} values for shape [{rows}, {k}] (dense: one per cell)",
                    data.len()
                );
            }
            let mut asked = Vec::with_capacity(data.len());
            for (i, &t) in data.iter().enumerate() {
                let cell = token(i, i / k.max(1), i % k.max(1), t)?;
                asked.push(cell.is_some());
                cells.extend(cell);
            }
            Layout::Dense(asked)
        }
        (Value::Null, _) | (_, Value::Null) => {
            bail!("{FIELD}: sparse_crow_indices and sparse_col_indices go together")
        }
        (c, o) => {
            let crow = ints(c, "sparse_crow_indices")?;
            let col = ints(o, "sparse_col_indices")?;
            if crow.len() != rows + 1
                || crow[0] != 0
                || crow.windows(2).any(|w| w[1] < w[0])
                || crow[rows] as usize != data.len()
                || col.len() != data.len()
            {
                bail!(
                    "{FIELD}: sparse_crow_indices must have len(prompt) = {} entries rising from 0 to the {} values, \
                     with one column index per value ({} given)",
                    rows + 1,
                    data.len(),
                    col.len()
                );
            }
            let mut asked = Vec::with_capacity(data.len());
            for row in 0..rows {
                for i in crow[row] as usize..crow[row + 1] as usize {
                    if col[i] < 0 || col[i] as usize >= k {
                        bail!(
                            "{FIELD}.sparse_col_indices[{i}] = {} is outside 0..{k}",
                            col[i]
                        );
                    }
                    let cell = token(i, row, col[i] as usize, data[i])?;
                    asked.push(cell.is_some());
                    cells.extend(cell);
                }
            }
            Layout::Sparse { crow, col, asked }
        }
    };
    if cells.is_empty() {
        bail!("{FIELD}: names no token id (every cell is -1); leave the field out instead");
    }
    // The cost bound the SDK announces, as for a top-k width: at most MAX_TOPK ids per position.
    let most = rows * temper_tinker::prompt_topk::MAX_TOPK;
    if cells.len() > most {
        bail!(
            "{FIELD}: {} ids asked for a {}-token prompt; at most {} per position ({most} in all)",
            cells.len(),
            prompt_len,
            temper_tinker::prompt_topk::MAX_TOPK
        );
    }
    Ok(TargetRequest {
        rows,
        k,
        layout,
        cells,
    })
}

/// `v` as a list of integers (`field` names it in the error).
fn ints(v: &Value, field: &str) -> Result<Vec<i64>> {
    let Some(list) = v.as_array() else {
        bail!("{FIELD}.{field}: must be a list of integers");
    };
    list.iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_i64()
                .ok_or_else(|| anyhow::anyhow!("{FIELD}.{field}[{i}]: {x} is not an integer"))
        })
        .collect()
}

impl TargetRequest {
    /// The answer: `values` (one per cell, in [`TargetRequest::cells`]' order) in the request's
    /// layout and shape, 0.0 where nothing was asked.
    pub fn answer(&self, values: &[f32]) -> proto::Tensor {
        let mut next = values.iter().copied();
        let mut fill = |asked: &[bool]| -> Vec<f32> {
            asked
                .iter()
                .map(|&a| if a { next.next().unwrap_or(0.0) } else { 0.0 })
                .collect()
        };
        let encoding = match &self.layout {
            Layout::Dense(asked) => proto::tensor::Encoding::Dense(proto::f32_bytes(fill(asked))),
            Layout::Sparse { crow, col, asked } => {
                proto::tensor::Encoding::SparseCsr(proto::SparseCsr {
                    values: proto::f32_bytes(fill(asked)),
                    crow_indices: proto::i64_bytes(crow.iter().copied()),
                    col_indices: proto::i64_bytes(col.iter().copied()),
                })
            }
        };
        proto::Tensor {
            encoding: Some(encoding),
            dtype: proto::DType::Float32 as i32,
            shape: vec![self.rows as i64, self.k as i64],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cells(pairs: &[(usize, i64)]) -> Vec<TargetCell> {
        pairs
            .iter()
            .map(|&(row, token)| TargetCell { row, token })
            .collect()
    }

    #[test]
    fn dense_and_sparse_cells_and_answers() {
        let dense = json!({"data": [5, -1, -1, 7], "dtype": "int64", "shape": [2, 2]});
        let t = parse(&dense, 3, 10).unwrap();
        assert_eq!(t.cells, cells(&[(0, 5), (1, 7)]));
        let a = t.answer(&[-1.5, -2.5]);
        let Some(proto::tensor::Encoding::Dense(b)) = a.encoding else {
            panic!("dense in, dense out")
        };
        assert_eq!(b, proto::f32_bytes([-1.5, 0.0, 0.0, -2.5]));
        assert_eq!(a.shape, vec![2, 2]);

        let sparse = json!({"data": [3, 4], "dtype": "int64", "shape": [2, 3],
            "sparse_crow_indices": [0, 0, 2], "sparse_col_indices": [0, 2]});
        let t = parse(&sparse, 3, 10).unwrap();
        assert_eq!(t.cells, cells(&[(1, 3), (1, 4)]));
        let Some(proto::tensor::Encoding::SparseCsr(c)) = t.answer(&[-0.5, -0.25]).encoding else {
            panic!("sparse in, sparse out")
        };
        assert_eq!(c.values, proto::f32_bytes([-0.5, -0.25]));
        assert_eq!(c.crow_indices, proto::i64_bytes([0, 0, 2]));
    }

    #[test]
    fn bad_tensors_are_one_line_errors_naming_the_field() {
        let cases = [
            (
                json!({"data": [1], "dtype": "float32", "shape": [1, 1]}),
                "dtype",
            ),
            (
                json!({"data": [1, 2], "dtype": "int64", "shape": [2, 1]}),
                "shape",
            ),
            (
                json!({"data": [1, 2, 3], "dtype": "int64", "shape": [1, 2]}),
                "values for shape",
            ),
            (
                json!({"data": [99], "dtype": "int64", "shape": [1, 1]}),
                "data[0]",
            ),
            (
                json!({"data": [1], "dtype": "int64", "shape": [1, 1],
                    "sparse_crow_indices": [0, 1], "sparse_col_indices": [4]}),
                "sparse_col_indices[0]",
            ),
            (
                json!({"data": [1], "dtype": "int64", "shape": [1, 1],
                    "sparse_crow_indices": [0, 5], "sparse_col_indices": [0]}),
                "sparse_crow_indices",
            ),
            (
                json!({"data": [1], "dtype": "int64", "shape": [1, 1], "sparse_col_indices": [0]}),
                "go together",
            ),
            (
                json!({"data": [-1, -1], "dtype": "int64", "shape": [1, 2]}),
                "no token id",
            ),
            (
                json!({"data": vec![1; 65], "dtype": "int64", "shape": [1, 65]}),
                "at most 64",
            ),
        ];
        for (v, want) in cases {
            let e = format!("{:#}", parse(&v, 2, 10).unwrap_err());
            assert!(
                e.contains(want) && e.starts_with(FIELD) && !e.contains('\n'),
                "{e}"
            );
        }
    }
}
