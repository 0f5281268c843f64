//! The grader's options, under math-verify 0.9.0's names and with its defaults, so that a reward
//! configured like a verl / TRL run grades like it: `strict`, `allow_set_relation_comp`,
//! `float_rounding`, `numeric_precision` (arguments of `verify`) and `extraction_config` (the
//! targets of `parse`: `"latex"`, `"expr"`, `"string"`).
use anyhow::{bail, Result};
use serde_json::Value;

/// What `parse`'s extraction targets let through (math-verify's `LatexExtractionConfig`,
/// `ExprExtractionConfig`, `StringExtractionConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtractionTargets {
    /// LaTeX: `\boxed{}`, math environments (`$..$`, `\(..\)`, `\[..\]`), `\frac{a}{b}`.
    pub latex: bool,
    /// Plain expressions and numbers in the text (`1/2`, `42`, `$100`).
    pub expr: bool,
    /// Multiple-choice letters `A`..`D` (math-verify's default strings).
    pub string: bool,
}

impl Default for ExtractionTargets {
    /// `parse`'s default: `[LatexExtractionConfig(), ExprExtractionConfig()]`.
    fn default() -> Self {
        ExtractionTargets {
            latex: true,
            expr: true,
            string: false,
        }
    }
}

/// Grading options; the defaults are math-verify's `verify` / `parse` defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraderOptions {
    /// Variables matter (`f(x) = x^2` is not `f(y) = y^2`). Off: the prediction's free variables
    /// are renamed to the gold's, in order, when there are as many of them.
    pub strict: bool,
    /// A relation in the prediction answers a set in the gold (`1 \le x \le 2` answers `[1,2]`).
    /// A relation in the gold is always answered by its set, as in math-verify.
    pub allow_set_relation_comp: bool,
    /// Decimal places a number with a decimal point is rounded to before comparing.
    pub float_rounding: u32,
    /// Significant digits of a numeric (non-exact) comparison.
    pub numeric_precision: u32,
    pub extraction_config: ExtractionTargets,
}

impl Default for GraderOptions {
    fn default() -> Self {
        GraderOptions {
            strict: true,
            allow_set_relation_comp: false,
            float_rounding: 6,
            numeric_precision: 15,
            extraction_config: ExtractionTargets::default(),
        }
    }
}

fn opt_bool(opts: &Value, key: &str, default: bool) -> Result<bool> {
    match opts.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => bail!("option {key:?} must be true or false, got {v}"),
    }
}

fn opt_digits(opts: &Value, key: &str, default: u32, max: u32) -> Result<u32> {
    match opts.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) if n <= max as u64 => Ok(n as u32),
            _ => bail!("option {key:?} must be an integer from 0 to {max}, got {v}"),
        },
    }
}

impl GraderOptions {
    /// Read the options from a reward's JSON options (null or an object; unknown keys are left to
    /// the reward).
    pub fn from_json(opts: &Value) -> Result<Self> {
        let d = GraderOptions::default();
        if opts.is_null() {
            return Ok(d);
        }
        let extraction_config = match opts.get("extraction_config") {
            None | Some(Value::Null) => d.extraction_config,
            Some(Value::Array(items)) => {
                let mut t = ExtractionTargets {
                    latex: false,
                    expr: false,
                    string: false,
                };
                for item in items {
                    match item.as_str() {
                        Some("latex") => t.latex = true,
                        Some("expr") => t.expr = true,
                        Some("string") => t.string = true,
                        _ => bail!(
                            "option \"extraction_config\" lists \"latex\", \"expr\" and \
                             \"string\", got {item}"
                        ),
                    }
                }
                if !(t.latex || t.expr || t.string) {
                    bail!("option \"extraction_config\" must name at least one target");
                }
                t
            }
            Some(v) => bail!("option \"extraction_config\" must be a list of targets, got {v}"),
        };
        Ok(GraderOptions {
            strict: opt_bool(opts, "strict", d.strict)?,
            allow_set_relation_comp: opt_bool(
                opts,
                "allow_set_relation_comp",
                d.allow_set_relation_comp,
            )?,
            float_rounding: opt_digits(opts, "float_rounding", d.float_rounding, 15)?,
            numeric_precision: opt_digits(opts, "numeric_precision", d.numeric_precision, 30)?,
            extraction_config,
        })
    }
}
