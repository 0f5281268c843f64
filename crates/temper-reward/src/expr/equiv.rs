//! Deciding whether two parsed answers are the same: exactly with rationals where both sides are
//! rational numbers, by evaluation at random points otherwise, structure by structure (tuples in
//! order, sets in any order, intervals with their brackets, equations up to a constant factor).
use super::eval::{eval_complex, exact_value};
use super::relations::*;
use super::Expr;
use num_complex::Complex64;
use num_rational::BigRational;
use num_traits::ToPrimitive;
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
    /// math-verify's `strict`: off, the prediction's variables are renamed to the gold's.
    pub strict: bool,
    /// math-verify's `allow_set_relation_comp`: a relation in the prediction answers a set.
    pub allow_set_relation_comp: bool,
    /// math-verify's `float_rounding`: decimals kept when a written decimal is compared.
    pub float_rounding: u32,
}

impl EquivOptions {
    pub fn with_deadline(deadline: Instant) -> Self {
        EquivOptions {
            deadline,
            rel_tol: 1e-8,
            points: 8,
            strict: true,
            allow_set_relation_comp: false,
            float_rounding: 6,
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
    let g = expand_pm(&evaluate_matrices(gold));
    let mut p = expand_pm(&evaluate_matrices(pred));
    if !o.strict {
        p = rename_like(&g, &p);
    }
    equiv(&g, &p, o)
}

/// Non-strict mode: the prediction's free variables renamed to the gold's, in order of first
/// appearance, when both have as many (`f(y) = y^2` answers `f(x) = x^2`).
fn rename_like(g: &Expr, p: &Expr) -> Expr {
    let (mut gs, mut ps) = (vec![], vec![]);
    g.symbols(&mut gs);
    p.symbols(&mut ps);
    if gs.len() != ps.len() || gs == ps {
        return p.clone();
    }
    let map: Vec<(String, String)> = ps.into_iter().zip(gs).collect();
    p.map_symbols(&|s: &str| {
        map.iter()
            .find(|(from, _)| from == s)
            .map_or_else(|| s.to_string(), |(_, to)| to.clone())
    })
}

/// Sums, differences, scalar multiples and products of literal matrices, worked out entry by
/// entry (entries stay expressions), so that `A + B` answers the matrix it equals.
fn evaluate_matrices(e: &Expr) -> Expr {
    fn go(e: &Expr) -> Option<Vec<Vec<Expr>>> {
        use Expr::*;
        let zip = |a: Vec<Vec<Expr>>, b: Vec<Vec<Expr>>, f: &dyn Fn(Expr, Expr) -> Expr| {
            let same = a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.len() == y.len());
            same.then(|| {
                a.into_iter()
                    .zip(b)
                    .map(|(ra, rb)| ra.into_iter().zip(rb).map(|(x, y)| f(x, y)).collect())
                    .collect()
            })
        };
        let scale = |m: Vec<Vec<Expr>>, k: &Expr| -> Vec<Vec<Expr>> {
            m.into_iter()
                .map(|r| r.into_iter().map(|x| Mul(k.clone().bx(), x.bx())).collect())
                .collect()
        };
        match e {
            Matrix(m) => Some(m.clone()),
            Add(a, b) => zip(go(a)?, go(b)?, &|x, y| Add(x.bx(), y.bx())),
            Sub(a, b) => zip(go(a)?, go(b)?, &|x, y| Sub(x.bx(), y.bx())),
            Neg(a) => Some(scale(go(a)?, &Expr::int(-1))),
            Mul(a, b) => match (go(a), go(b)) {
                (Some(x), Some(y)) => {
                    let inner = x.first()?.len();
                    if inner != y.len() || y.iter().any(|r| r.len() != y[0].len()) {
                        return None;
                    }
                    Some(
                        x.iter()
                            .map(|row| {
                                (0..y[0].len())
                                    .map(|j| {
                                        (0..inner)
                                            .map(|k| Mul(row[k].clone().bx(), y[k][j].clone().bx()))
                                            .reduce(|s, t| Add(s.bx(), t.bx()))
                                            .unwrap_or_else(|| Expr::int(0))
                                    })
                                    .collect()
                            })
                            .collect(),
                    )
                }
                (Some(x), None) if b.is_scalar() => Some(scale(x, b)),
                (None, Some(y)) if a.is_scalar() => Some(scale(y, a)),
                _ => None,
            },
            _ => None,
        }
    }
    match e {
        Expr::Add(..) | Expr::Sub(..) | Expr::Mul(..) | Expr::Neg(..) => {
            go(e).map_or_else(|| e.clone(), Expr::Matrix)
        }
        _ => e.clone(),
    }
}

pub(super) fn timed_out(o: &EquivOptions) -> bool {
    Instant::now() >= o.deadline
}

pub(super) fn equiv(g: &Expr, p: &Expr, o: &EquivOptions) -> bool {
    if timed_out(o) {
        return false;
    }
    use Expr::*;
    // Equations as math-verify reads them: an equation in the prediction against a gold that is
    // not one answers with its last side (`2x = 4` answers `4`); a gold assignment (`x = 3`, a
    // name on the left) against a prediction that is no equation is its value.
    let (g_eq, p_eq) = (is_equation(g), is_equation(p));
    if p_eq && !g_eq {
        return equiv(g, last_side(p), o);
    }
    if g_eq && !p_eq && is_assignment(g) {
        return equiv(last_side(g), p, o);
    }
    match (g, p) {
        (Rel { .. }, Rel { .. }) => rel_equiv(g, p, o),
        // A relation in the gold is the set it describes; one in the prediction answers a set
        // only with `allow_set_relation_comp`.
        (Rel { .. }, Interval { .. } | Union(_) | Tuple(_) | Set(_)) => match rel_to_set(g) {
            Some(i) => equiv(&i, p, o),
            None => false,
        },
        (Interval { .. } | Union(_) | Tuple(_) | Set(_), Rel { .. })
            if o.allow_set_relation_comp =>
        {
            match rel_to_set(p) {
                Some(i) => equiv(g, &i, o),
                None => false,
            }
        }
        (Rel { .. }, _) | (_, Rel { .. }) => false,
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
        (Set(a), Set(b)) | (Set(a), List(b)) | (List(a), Set(b)) | (List(a), List(b)) => {
            unordered(&distinct(a), &distinct(b), o)
        }
        // A gold set against a tuple or an open interval `(a, b)`: the elements in any order; a
        // gold tuple against a set or list: in the order written (math-verify sorts a gold set).
        (Tuple(a), Tuple(b)) | (Tuple(a), List(b)) | (Tuple(a), Set(b)) => ordered(a, b, o),
        (List(a), Tuple(b)) | (Set(a), Tuple(b)) => unordered(&distinct(a), b, o),
        (
            List(a) | Set(a),
            Interval {
                lo,
                hi,
                lo_closed: false,
                hi_closed: false,
            },
        ) => unordered(&distinct(a), &[(**lo).clone(), (**hi).clone()], o),
        (
            Interval {
                lo,
                hi,
                lo_closed: false,
                hi_closed: false,
            },
            List(b) | Set(b),
        ) => ordered(&[(**lo).clone(), (**hi).clone()], b, o),
        // `\{5\}`, `5, 5` and `5` name the same single answer.
        (Set(a), x) | (List(a), x) if x.is_scalar() && distinct(a).len() == 1 => equiv(&a[0], x, o),
        (x, Set(b)) | (x, List(b)) if x.is_scalar() && distinct(b).len() == 1 => equiv(x, &b[0], o),
        _ if g.is_scalar() && p.is_scalar() => scalar_equiv(g, p, o),
        _ => false,
    }
}

/// A set's elements with repeats dropped (`8, 10, 8` is the set `{8, 10}`).
fn distinct(v: &[Expr]) -> Vec<Expr> {
    let mut out: Vec<Expr> = vec![];
    for x in v {
        let repeat = out.iter().any(|y| {
            y == x || matches!((exact_value(x), exact_value(y)), (Some(a), Some(b)) if a == b)
        });
        if !repeat {
            out.push(x.clone());
        }
    }
    out
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

/// As [`random_env`], with a random sign on each value: used when an absolute value is
/// compared, so that `|x|` is not taken for `x`.
pub(super) fn random_signed_env(syms: &[String], rng: &mut impl Rng) -> Vec<(String, Complex64)> {
    let mut env = random_env(syms, rng);
    for (_, v) in env.iter_mut() {
        if rng.random_bool(0.5) {
            *v = -*v;
        }
    }
    env
}

/// Whether an absolute value occurs in the tree.
pub(super) fn has_abs(e: &Expr) -> bool {
    use Expr::*;
    match e {
        Call(super::Func::Abs, _) => true,
        Add(a, b) | Sub(a, b) | Mul(a, b) | Div(a, b) | Pow(a, b) | PlusMinus(a, b) => {
            has_abs(a) || has_abs(b)
        }
        Neg(a) => has_abs(a),
        Call(_, v) | Tuple(v) | List(v) | Set(v) | Union(v) => v.iter().any(has_abs),
        Rel { terms, .. } => terms.iter().any(has_abs),
        _ => false,
    }
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

/// A number written with a decimal point (`0.33`, `-2.5`), as math-verify's Float.
fn is_written_decimal(e: &Expr) -> bool {
    match e {
        Expr::Num { decimals, .. } => *decimals > 0,
        Expr::Neg(a) => is_written_decimal(a),
        _ => false,
    }
}

/// `v` rounded to `places` decimals, scaled to an integer; a tie goes to the even neighbour, as
/// sympy rounds a written decimal (`0.785` to two places is `0.78`).
fn rounded_scaled(v: &BigRational, places: u32) -> BigRational {
    let scale = BigRational::from_integer(num_bigint::BigInt::from(10u32).pow(places));
    let x = v * scale;
    let floor = x.floor();
    let half = BigRational::new(1.into(), 2.into());
    let frac = &x - &floor;
    let one = BigRational::from_integer(1.into());
    let odd = (floor.to_integer() % 2u32) != 0.into();
    if frac > half || frac == half && odd {
        floor + one
    } else {
        floor
    }
}

/// math-verify's comparison when one side is a written decimal: both sides rounded to
/// `float_rounding` places (`1/3 == 0.333333`, `0.33 != 1/3`, `2.5 != 49/20`).
fn decimal_equal(g: &Expr, p: &Expr, places: u32) -> Option<bool> {
    let value = |e: &Expr| -> Option<BigRational> {
        if let Some(v) = exact_value(e) {
            return Some(v);
        }
        let mut syms = vec![];
        e.symbols(&mut syms);
        if !syms.is_empty() || has_inf(e) {
            return None;
        }
        let z = eval_complex(e, &[]);
        (finite(z) && z.im.abs() <= 1e-12 * z.re.abs().max(1.0))
            .then(|| BigRational::from_float(z.re))
            .flatten()
    };
    let (a, b) = (value(g)?, value(p)?);
    Some(rounded_scaled(&a, places) == rounded_scaled(&b, places))
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
    if is_written_decimal(g) || is_written_decimal(p) {
        if let Some(eq) = decimal_equal(g, p, o.float_rounding) {
            return eq;
        }
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
        let env = if has_abs(g) || has_abs(p) {
            random_signed_env(&syms, &mut rng)
        } else {
            random_env(&syms, &mut rng)
        };
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
