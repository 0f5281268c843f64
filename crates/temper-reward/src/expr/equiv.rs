//! Deciding whether two parsed answers are the same: exactly with rationals where both sides are
//! rational numbers, by evaluation at random points otherwise, structure by structure (tuples in
//! order, sets in any order, intervals with their brackets, equations up to a constant factor).
use super::eval::{eval_complex, exact_value};
use super::relations::*;
use super::Expr;
use num_complex::Complex64;
use num_rational::BigRational;
use num_traits::{One, ToPrimitive, Zero};
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// Knobs for one comparison.
#[derive(Clone, Debug)]
pub struct EquivOptions {
    /// Give up (answer "not equal") after this instant.
    pub deadline: Instant,
    /// Relative tolerance for floating-point agreement of non-rational values.
    pub rel_tol: f64,
    /// Random points tried for expressions with free variables.
    pub points: usize,
}

impl EquivOptions {
    pub fn with_deadline(deadline: Instant) -> Self {
        EquivOptions {
            deadline,
            rel_tol: 1e-8,
            points: 8,
        }
    }
}

/// A decimal written with at least this many digits after the point is taken to be a rounding
/// of an exact value (as math-verify's default `float_rounding=6` does).
const ROUNDED_DECIMALS: u32 = 6;
const ROUNDED_TOL: f64 = 1e-6;
/// Most alternatives `\pm` may expand into.
const MAX_ALTERNATIVES: usize = 16;

/// Whether `pred` is equivalent to `gold`. Asymmetric only in being lenient the same way both
/// ways; `equivalent(a, b) == equivalent(b, a)` for all inputs the tests cover.
pub fn equivalent(gold: &Expr, pred: &Expr, o: &EquivOptions) -> bool {
    let g = expand_pm(gold);
    let p = expand_pm(pred);
    equiv(&g, &p, o)
}

pub(super) fn timed_out(o: &EquivOptions) -> bool {
    Instant::now() >= o.deadline
}

pub(super) fn equiv(g: &Expr, p: &Expr, o: &EquivOptions) -> bool {
    if timed_out(o) {
        return false;
    }
    use Expr::*;
    match (g, p) {
        (Rel { .. }, Rel { .. }) => rel_equiv(g, p, o),
        (Rel { .. }, Interval { .. } | Union(_) | Tuple(_)) => match rel_to_interval(g) {
            Some(i) => equiv(&i, p, o),
            None => false,
        },
        (Interval { .. } | Union(_) | Tuple(_), Rel { .. }) => match rel_to_interval(p) {
            Some(i) => equiv(g, &i, o),
            None => false,
        },
        (Rel { .. }, _) => match named_value(g) {
            Some(v) => equiv(v, p, o),
            None => false,
        },
        (_, Rel { .. }) => match named_value(p) {
            Some(v) => equiv(g, v, o),
            None => false,
        },
        (Text(_), _) | (_, Text(_)) => match (text_of(g), text_of(p)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        },
        (Matrix(a), Matrix(b)) => {
            a.len() == b.len()
                && a.iter().zip(b).all(|(ra, rb)| {
                    ra.len() == rb.len() && ra.iter().zip(rb).all(|(x, y)| equiv(x, y, o))
                })
        }
        // A one-column matrix and a tuple are the same vector.
        (Matrix(m), Tuple(t)) | (Tuple(t), Matrix(m)) => {
            m.iter().all(|r| r.len() == 1)
                && m.len() == t.len()
                && m.iter().zip(t).all(|(r, x)| equiv(&r[0], x, o))
        }
        (
            Interval {
                lo: a,
                hi: b,
                lo_closed: ca,
                hi_closed: cb,
            },
            Interval {
                lo: c,
                hi: d,
                lo_closed: cc,
                hi_closed: cd,
            },
        ) => ca == cc && cb == cd && equiv(a, c, o) && equiv(b, d, o),
        (
            Interval {
                lo,
                hi,
                lo_closed: false,
                hi_closed: false,
            },
            Tuple(t),
        )
        | (
            Tuple(t),
            Interval {
                lo,
                hi,
                lo_closed: false,
                hi_closed: false,
            },
        ) => t.len() == 2 && equiv(lo, &t[0], o) && equiv(hi, &t[1], o),
        (Union(a), Union(b)) => unordered(a, b, o),
        (Union(a), List(b)) | (List(b), Union(a)) => {
            rels_to_union(b).is_some_and(|b| unordered(a, &b, o))
        }
        (Set(a), Set(b)) | (Set(a), List(b)) | (List(a), Set(b)) | (List(a), List(b)) => {
            unordered(a, b, o)
        }
        (Tuple(a), Tuple(b)) | (Tuple(a), List(b)) | (List(a), Tuple(b)) => ordered(a, b, o),
        // `\{5\}` and `5` name the same single answer.
        (Set(a), x) | (List(a), x) if a.len() == 1 && x.is_scalar() => equiv(&a[0], x, o),
        (x, Set(b)) | (x, List(b)) if b.len() == 1 && x.is_scalar() => equiv(x, &b[0], o),
        _ if g.is_scalar() && p.is_scalar() => scalar_equiv(g, p, o),
        _ => false,
    }
}

pub(super) fn ordered(a: &[Expr], b: &[Expr], o: &EquivOptions) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| equiv(x, y, o))
}

/// Every element matched to a distinct element of the other side.
fn unordered(a: &[Expr], b: &[Expr], o: &EquivOptions) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut used = vec![false; b.len()];
    'outer: for x in a {
        for (j, y) in b.iter().enumerate() {
            if !used[j] && equiv(x, y, o) {
                used[j] = true;
                continue 'outer;
            }
        }
        return false;
    }
    true
}

fn text_of(e: &Expr) -> Option<String> {
    let raw = match e {
        Expr::Text(t) => t.clone(),
        Expr::Sym(s) => s.clone(),
        Expr::E => "e".into(),
        Expr::I => "i".into(),
        _ => return None,
    };
    let t: String = raw
        .chars()
        .filter(|c| !matches!(c, '(' | ')' | ' ' | '.' | '{' | '}'))
        .collect();
    Some(t.to_lowercase())
}

pub(super) fn finite(z: Complex64) -> bool {
    z.re.is_finite() && z.im.is_finite()
}

pub(super) fn close(a: Complex64, b: Complex64, tol: f64) -> bool {
    (a - b).norm() <= tol * a.norm().max(b.norm()) + 1e-12
}

pub(super) fn random_env(syms: &[String], rng: &mut impl Rng) -> Vec<(String, Complex64)> {
    syms.iter()
        .map(|s| (s.clone(), Complex64::new(rng.random_range(0.5..2.5), 0.0)))
        .collect()
}

fn max_decimals(e: &Expr) -> u32 {
    match e {
        Expr::Num { decimals, .. } => *decimals,
        Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) | Expr::Pow(a, b) => {
            max_decimals(a).max(max_decimals(b))
        }
        Expr::Neg(a) => max_decimals(a),
        Expr::Call(_, v) => v.iter().map(max_decimals).max().unwrap_or(0),
        _ => 0,
    }
}

fn has_inf(e: &Expr) -> bool {
    match e {
        Expr::Inf => true,
        Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) | Expr::Pow(a, b) => {
            has_inf(a) || has_inf(b)
        }
        Expr::Neg(a) => has_inf(a),
        Expr::Call(_, v) => v.iter().any(has_inf),
        _ => false,
    }
}

/// A gold written as a decimal with 2 to 5 digits after the point (`0.33`, `2.6667`) is a
/// rounding: a prediction with no decimal point whose value never terminates (`\frac13`,
/// `\sqrt2`, `\pi`) answers it when it rounds (half away from zero) to the gold at the gold's
/// precision. Exact terminating values (`\frac{33}{100}`) and decimals compare as they are, and a
/// one-digit gold (`2.5`) is taken as exact.
fn rounds_to_gold(g: &Expr, p: &Expr) -> bool {
    if let Expr::Neg(g) = g {
        return rounds_to_gold(g, &Expr::Neg(Box::new(p.clone())));
    }
    let Expr::Num {
        value: gold,
        decimals: d @ 2..ROUNDED_DECIMALS,
    } = g
    else {
        return false;
    };
    if max_decimals(p) > 0 || has_inf(p) || !p.is_scalar() {
        return false;
    }
    let mut syms = vec![];
    p.symbols(&mut syms);
    if !syms.is_empty() {
        return false;
    }
    let scale = num_bigint::BigInt::from(10u32).pow(*d);
    let gold_scaled = gold * BigRational::from_integer(scale.clone());
    if !gold_scaled.is_integer() {
        return false;
    }
    let rounded = match exact_value(p) {
        Some(v) => {
            if terminates(&v) {
                return false;
            }
            (v * BigRational::from_integer(scale)).round()
        }
        None => {
            let z = eval_complex(p, &[]);
            if !(finite(z) && z.im.abs() <= 1e-12 * z.re.abs().max(1.0)) {
                return false;
            }
            let x = (z.re * 10f64.powi(*d as i32)).round();
            match BigRational::from_float(x) {
                Some(r) => r,
                None => return false,
            }
        }
    };
    rounded == gold_scaled
}

/// Whether a rational has a finite decimal expansion (its reduced denominator is 2^a 5^b).
fn terminates(v: &BigRational) -> bool {
    let mut d = v.denom().clone();
    for f in [2u32, 5] {
        let f = num_bigint::BigInt::from(f);
        while (&d % &f).is_zero() {
            d /= &f;
        }
    }
    d.is_one()
}

fn scalar_equiv(g: &Expr, p: &Expr, o: &EquivOptions) -> bool {
    if g == p {
        return true;
    }
    let rounded = max_decimals(g).max(max_decimals(p)) >= ROUNDED_DECIMALS;
    let tol = if rounded { ROUNDED_TOL } else { o.rel_tol };
    if has_inf(g) || has_inf(p) {
        let a = eval_complex(g, &[]);
        let b = eval_complex(p, &[]);
        return a.im == 0.0 && b.im == 0.0 && a.re.is_infinite() && a.re == b.re;
    }
    if rounds_to_gold(g, p) {
        return true;
    }
    if let (Some(a), Some(b)) = (exact_value(g), exact_value(p)) {
        if a == b {
            return true;
        }
        if !rounded {
            return false;
        }
        let (x, y) = (
            a.to_f64().unwrap_or(f64::NAN),
            b.to_f64().unwrap_or(f64::NAN),
        );
        return (x - y).abs() <= tol * x.abs().max(y.abs()).max(1.0);
    }
    let mut syms = vec![];
    g.symbols(&mut syms);
    p.symbols(&mut syms);
    if syms.is_empty() {
        let a = eval_complex(g, &[]);
        let b = eval_complex(p, &[]);
        return finite(a) && finite(b) && close(a, b, tol);
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x005e_ed0f_9a0e);
    let mut agreeing = 0;
    for _ in 0..o.points * 3 {
        if timed_out(o) {
            return false;
        }
        if agreeing >= o.points {
            break;
        }
        let env = random_env(&syms, &mut rng);
        let a = eval_complex(g, &env);
        let b = eval_complex(p, &env);
        match (finite(a), finite(b)) {
            (true, true) => {
                if !close(a, b, tol) {
                    return false;
                }
                agreeing += 1;
            }
            (false, false) => {}
            _ => return false,
        }
    }
    agreeing >= 3
}

/// Scalar alternatives of an expression with `\pm` in it (`1 \pm \sqrt 2` -> both values).
fn alternatives(e: &Expr) -> Vec<Expr> {
    use Expr::*;
    let bin = |a: &Expr, b: &Expr, f: &dyn Fn(Box<Expr>, Box<Expr>) -> Expr| {
        let (xa, xb) = (alternatives(a), alternatives(b));
        let mut out = vec![];
        for x in &xa {
            for y in &xb {
                if out.len() < MAX_ALTERNATIVES {
                    out.push(f(Box::new(x.clone()), Box::new(y.clone())));
                }
            }
        }
        out
    };
    match e {
        PlusMinus(a, b) => {
            let mut v = bin(a, b, &|x, y| Add(x, y));
            v.extend(bin(a, b, &|x, y| Sub(x, y)));
            v.truncate(MAX_ALTERNATIVES);
            v
        }
        Add(a, b) => bin(a, b, &Add),
        Sub(a, b) => bin(a, b, &Sub),
        Mul(a, b) => bin(a, b, &Mul),
        Div(a, b) => bin(a, b, &Div),
        Pow(a, b) => bin(a, b, &Pow),
        Neg(a) => alternatives(a)
            .into_iter()
            .map(|x| Neg(Box::new(x)))
            .collect(),
        Call(f, args) if args.len() == 1 => alternatives(&args[0])
            .into_iter()
            .map(|x| Call(*f, vec![x]))
            .collect(),
        other => vec![other.clone()],
    }
}

fn has_pm(e: &Expr) -> bool {
    use Expr::*;
    match e {
        PlusMinus(..) => true,
        Add(a, b) | Sub(a, b) | Mul(a, b) | Div(a, b) | Pow(a, b) => has_pm(a) || has_pm(b),
        Neg(a) => has_pm(a),
        Call(_, v) => v.iter().any(has_pm),
        _ => false,
    }
}

/// Replace `\pm` scalars by the list of their values; inside sets and lists, flatten.
fn expand_pm(e: &Expr) -> Expr {
    use Expr::*;
    let flat = |v: &[Expr]| -> Vec<Expr> {
        let mut out = vec![];
        for x in v {
            if has_pm(x) {
                out.extend(alternatives(x));
            } else {
                out.push(expand_pm(x));
            }
        }
        out
    };
    match e {
        _ if e.is_scalar() || matches!(e, PlusMinus(..)) => {
            if has_pm(e) {
                List(alternatives(e))
            } else {
                e.clone()
            }
        }
        Set(v) => Set(flat(v)),
        List(v) => List(flat(v)),
        Tuple(v) => Tuple(v.iter().map(expand_pm).collect()),
        Rel { terms, ops } => Rel {
            terms: terms.iter().map(expand_pm).collect(),
            ops: ops.clone(),
        },
        other => other.clone(),
    }
}
