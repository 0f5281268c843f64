//! JSON nested lists <-> tensors, and the element-wise comparison of `VECTORS.md`.

use anyhow::{bail, Result};
use serde_json::Value;
use tch::{Kind, Tensor};

/// A rectangular array read from JSON (row-major); `null` entries are NaN.
#[derive(Debug, Clone)]
pub(crate) struct Array {
    pub shape: Vec<i64>,
    pub data: Vec<f64>,
}

impl Array {
    pub fn tensor(&self) -> Tensor {
        Tensor::from_slice(&self.data)
            .reshape(&self.shape)
            .to_kind(Kind::Double)
    }
}

fn parse_into(
    v: &Value,
    allow_null: bool,
    path: &mut String,
    data: &mut Vec<f64>,
) -> Result<Vec<i64>> {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(x) => {
                data.push(x);
                Ok(vec![])
            }
            None => bail!("{path}: number {n} is not representable as f64"),
        },
        Value::Bool(b) => {
            data.push(if *b { 1.0 } else { 0.0 });
            Ok(vec![])
        }
        Value::Null if allow_null => {
            data.push(f64::NAN);
            Ok(vec![])
        }
        Value::Null => bail!("{path}: null is only allowed in `expected`"),
        Value::Array(items) => {
            let mut child: Option<Vec<i64>> = None;
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                let s = parse_into(item, allow_null, path, data)?;
                path.truncate(len);
                match &child {
                    None => child = Some(s),
                    Some(c) if *c != s => bail!(
                        "{path}: ragged array (element 0 has shape {c:?}, element {i} has shape {s:?})"
                    ),
                    Some(_) => {}
                }
            }
            let mut shape = vec![items.len() as i64];
            shape.extend(child.unwrap_or_default());
            Ok(shape)
        }
        other => bail!("{path}: expected a number or a list, got {other}"),
    }
}

/// Parse a number or nested list of numbers; `what` names it in errors.
pub(crate) fn parse_array(v: &Value, allow_null: bool, what: &str) -> Result<Array> {
    let mut data = Vec::new();
    let mut path = what.to_string();
    let shape = parse_into(v, allow_null, &mut path, &mut data)?;
    Ok(Array { shape, data })
}

fn squeezed(shape: &[i64]) -> Vec<i64> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// Compare `got` with `want` element-wise: `|got - want| <= atol + rtol |want|`; a NaN `want`
/// (JSON null) requires NaN, a NaN `got` elsewhere fails. Shapes must match up to size-1 dims.
/// Returns the max abs error over non-NaN entries, or a one-line reason.
pub(crate) fn compare(
    key: &str,
    got: &Tensor,
    want: &Array,
    rtol: f64,
    atol: f64,
) -> std::result::Result<f64, String> {
    let gshape = got.size();
    if gshape != want.shape && squeezed(&gshape) != squeezed(&want.shape) {
        return Err(format!(
            "{key}: shape {gshape:?}, expected {:?}",
            want.shape
        ));
    }
    let g = match Vec::<f64>::try_from(
        &got.detach()
            .to_kind(Kind::Double)
            .to_device(tch::Device::Cpu)
            .reshape([-1]),
    ) {
        Ok(g) => g,
        Err(e) => return Err(format!("{key}: cannot read result: {e}")),
    };
    let mut max_err: f64 = 0.0;
    let mut worst: Option<(usize, f64, f64)> = None;
    for (i, (&x, &w)) in g.iter().zip(&want.data).enumerate() {
        if w.is_nan() {
            if !x.is_nan() {
                return Err(format!(
                    "{key}[{}]: got {x}, expected NaN (null)",
                    flat_index(&want.shape, i)
                ));
            }
            continue;
        }
        let err = (x - w).abs();
        let bad = x.is_nan() || err > atol + rtol * w.abs();
        // The worst failure: a NaN beats any number.
        if bad && worst.is_none_or(|(_, e, _)| err.is_nan() || e < err) {
            worst = Some((i, err, x));
        }
        if err > max_err || err.is_nan() {
            max_err = err;
        }
    }
    if let Some((i, _, x)) = worst {
        return Err(format!(
            "{key}[{}]: got {x}, expected {} (|diff| {:.3e} > atol {atol:e} + rtol {rtol:e} * |want|)",
            flat_index(&want.shape, i),
            want.data[i],
            (x - want.data[i]).abs()
        ));
    }
    Ok(max_err)
}

/// `i` as a multi-index `a,b,c` of `shape`.
fn flat_index(shape: &[i64], mut i: usize) -> String {
    if shape.is_empty() {
        return "0".into();
    }
    let mut idx = vec![0usize; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        let d = d.max(1) as usize;
        idx[k] = i % d;
        i /= d;
    }
    idx.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
