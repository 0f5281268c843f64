//! Bounds on an absolute value as the sets they describe, as sympy's `as_set` gives them to
//! math-verify: `|x| < 2` is `(-2, 2)`, `|x - 1| \ge 3` is `(-\infty, -2] \cup [4, \infty)`,
//! `1 \le |z| \le 3/2` is `[-3/2, -1] \cup [1, 3/2]`. The argument may be any linear function of
//! one variable (`|2x - 1|`, `|1 - x|`).
use super::eval::exact_value;
use super::relations::{interval, is_variable};
use super::{Expr, Func, RelOp};
use num_rational::BigRational;
use num_traits::{One, Signed, Zero};

/// One end of an interval of values of the argument: the value and whether it is included.
type End = (Expr, bool);

/// The set of the variable for which the relation holds, when it bounds an absolute value.
pub(super) fn abs_bound_to_set(terms: &[Expr], ops: &[RelOp]) -> Option<Expr> {
    let (pieces, arg) = match (terms, ops) {
        // `|f| op r` or `r op |f|`.
        ([Expr::Call(Func::Abs, arg), r], [op]) => (outside_or_inside(r, *op)?, arg),
        ([r, Expr::Call(Func::Abs, arg)], [op]) => (outside_or_inside(r, flip(*op))?, arg),
        // `lo op |f| op hi`, written upwards or downwards.
        ([lo, Expr::Call(Func::Abs, arg), hi], [a, b]) => {
            let up = |op: &RelOp| matches!(op, RelOp::Lt | RelOp::Le);
            let down = |op: &RelOp| matches!(op, RelOp::Gt | RelOp::Ge);
            let (lo, hi, lo_closed, hi_closed) = if up(a) && up(b) {
                (lo, hi, *a == RelOp::Le, *b == RelOp::Le)
            } else if down(a) && down(b) {
                (hi, lo, *b == RelOp::Ge, *a == RelOp::Ge)
            } else {
                return None;
            };
            let pieces = vec![
                ((neg(hi), hi_closed), (neg(lo), lo_closed)),
                ((lo.clone(), lo_closed), (hi.clone(), hi_closed)),
            ];
            (pieces, arg)
        }
        _ => return None,
    };
    let [arg] = arg.as_slice() else {
        return None;
    };
    let (a, b) = linear(arg)?;
    let mut sets: Vec<Expr> = pieces
        .into_iter()
        .map(|(lo, hi)| solve_for_variable(lo, hi, &a, &b))
        .collect();
    Some(if sets.len() == 1 {
        sets.pop().unwrap()
    } else {
        Expr::Union(sets)
    })
}

/// The values of the argument `f` with `|f| op r`: one interval inside, two outside.
fn outside_or_inside(r: &Expr, op: RelOp) -> Option<Vec<(End, End)>> {
    let closed = matches!(op, RelOp::Le | RelOp::Ge);
    let neg_inf = || Expr::Neg(Box::new(Expr::Inf));
    match op {
        RelOp::Lt | RelOp::Le => Some(vec![((neg(r), closed), (r.clone(), closed))]),
        RelOp::Gt | RelOp::Ge => Some(vec![
            ((neg_inf(), false), (neg(r), closed)),
            ((r.clone(), closed), (Expr::Inf, false)),
        ]),
        _ => None,
    }
}

/// `a x + b` in `[lo, hi]` as an interval of `x` (the ends swap when `a < 0`).
fn solve_for_variable(lo: End, hi: End, a: &BigRational, b: &Expr) -> Expr {
    let positive = a.is_positive();
    let point = |v: Expr| -> Expr {
        let infinite = |e: &Expr| matches!(e, Expr::Inf);
        match &v {
            e if infinite(e) => signed_inf(positive),
            Expr::Neg(e) if infinite(e) => signed_inf(!positive),
            _ if a.is_one() && is_zero(b) => v,
            _ => Expr::Div(
                Box::new(Expr::Sub(Box::new(v), Box::new(b.clone()))),
                Box::new(rational(a.clone())),
            ),
        }
    };
    let ((l, lc), (h, hc)) = (lo, hi);
    if positive {
        interval(point(l), point(h), lc, hc)
    } else {
        interval(point(h), point(l), hc, lc)
    }
}

/// `f` as `a x + b` with `a` a nonzero rational and `b` free of variables, for one variable
/// (or function of variables) `x`.
fn linear(e: &Expr) -> Option<(BigRational, Expr)> {
    let constant = |c: &Expr| {
        let mut syms = vec![];
        c.symbols(&mut syms);
        syms.is_empty()
    };
    let (a, b) = match e {
        _ if is_variable(e) => (BigRational::one(), Expr::int(0)),
        Expr::Neg(x) => {
            let (a, b) = linear(x)?;
            (-a, neg(&b))
        }
        Expr::Mul(k, x) | Expr::Mul(x, k) if constant(k) => {
            let k = exact_value(k)?;
            let (a, b) = linear(x)?;
            (a * &k, Expr::Mul(Box::new(rational(k)), Box::new(b)))
        }
        Expr::Div(x, k) if constant(k) => {
            let k = exact_value(k)?;
            if k.is_zero() {
                return None;
            }
            let (a, b) = linear(x)?;
            (a / &k, Expr::Div(Box::new(b), Box::new(rational(k))))
        }
        Expr::Add(x, c) | Expr::Add(c, x) if constant(c) => {
            let (a, b) = linear(x)?;
            (a, Expr::Add(Box::new(b), c.clone()))
        }
        Expr::Sub(x, c) if constant(c) => {
            let (a, b) = linear(x)?;
            (a, Expr::Sub(Box::new(b), c.clone()))
        }
        Expr::Sub(c, x) if constant(c) => {
            let (a, b) = linear(x)?;
            (-a, Expr::Sub(c.clone(), Box::new(b)))
        }
        _ => return None,
    };
    (!a.is_zero()).then_some((a, b))
}

fn is_zero(e: &Expr) -> bool {
    exact_value(e).is_some_and(|v| v.is_zero())
}

fn rational(v: BigRational) -> Expr {
    Expr::Num {
        value: v,
        decimals: 0,
    }
}

fn signed_inf(positive: bool) -> Expr {
    if positive {
        Expr::Inf
    } else {
        Expr::Neg(Box::new(Expr::Inf))
    }
}

fn neg(e: &Expr) -> Expr {
    Expr::Neg(Box::new(e.clone()))
}

fn flip(op: RelOp) -> RelOp {
    super::relations::flip(op)
}
