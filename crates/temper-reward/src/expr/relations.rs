//! Relations as answers: equations (`x = 3`, `(p,q) = (3,2)`: a label or a variable on the left
//! compares by its value), inequalities and chains (compared as intervals, `0 < f(x) < 1` as
//! `(0, 1)`), and "or"-lists of them as unions of intervals.
use super::equiv::{
    close, equiv, finite, has_abs, ordered, random_env, random_signed_env, timed_out, EquivOptions,
};
use super::eval::eval_complex;
use super::{Expr, Func, RelOp};
use num_complex::Complex64;
use rand::SeedableRng;

/// A name, or a tuple of names: the left side of `x = 3`, `(a, b) = (1, 2)`.
pub(super) fn is_name(e: &Expr) -> bool {
    match e {
        Expr::Sym(_) => true,
        Expr::Tuple(v) | Expr::List(v) => v.iter().all(|x| matches!(x, Expr::Sym(_))),
        _ => false,
    }
}

/// A chain `a = b = ... = z` read as one equation: from the last bare name on the left (or the
/// first term) to the last term, as math-verify does for `x = 5 + 6 = 11`.
pub(super) fn reduce_chain(terms: &[Expr], ops: &[RelOp]) -> (Expr, RelOp, Expr) {
    let n = terms.len();
    if ops.iter().all(|&op| op == RelOp::Eq) {
        // A chain that starts with a label is that label's value (`x = y = 4` is `x = 4`, not
        // `y = 4`), as math-verify truncates an assignment chain.
        if only_names(&terms[0]) {
            return (terms[0].clone(), RelOp::Eq, terms[n - 1].clone());
        }
        let lhs = terms[..n - 1]
            .iter()
            .rev()
            .find(|t| is_name(t))
            .unwrap_or(&terms[0]);
        return (lhs.clone(), RelOp::Eq, terms[n - 1].clone());
    }
    // Mixed chain such as `x = 1/3 \approx 0.33`: the first relation that is not approximate.
    (terms[0].clone(), ops[0], terms[1].clone())
}

/// An equation or chain of them (`a = b`, `a = b = c`).
pub(super) fn is_equation(e: &Expr) -> bool {
    matches!(e, Expr::Rel { ops, .. } if ops.iter().all(|&op| op == RelOp::Eq))
}

/// An equation whose left side names a quantity (`x = 3`, `f(x) = 2x`, `(p, q) = (3, 2)`).
pub(super) fn is_assignment(e: &Expr) -> bool {
    match e {
        Expr::Rel { terms, .. } if is_equation(e) => {
            let lhs = match &terms[0] {
                // `|AB| = 1` names the length |AB|.
                Expr::Call(Func::Abs, args) if args.len() == 1 => &args[0],
                other => other,
            };
            is_name(lhs) || only_names(lhs)
        }
        _ => false,
    }
}

/// An expression built from names alone, with no number in it: a label such as `P:Q`,
/// `\frac{AM}{MB}`, `S_1:S_2`, `a + b` or `f(x)`. math-verify takes an equation with such a left
/// side for an assignment (`P:Q = 2` answers `2`); `2x`, `a - b` (`a + (-1) b`) and `x^2` hold a
/// number and are not labels (but `x/2` is, see below).
fn only_names(e: &Expr) -> bool {
    match e {
        Expr::Sym(_) => true,
        Expr::Mul(a, b) | Expr::Add(a, b) => only_names(a) && only_names(b),
        // A division is a power -1 to sympy, which math-verify lets through when its base is a
        // name or a bare number: `x/2 = 12` and `P:Q = 2` are labels, `1/a = 5` is not.
        Expr::Div(a, b) => only_names(a) && (only_names(b) || matches!(**b, Expr::Num { .. })),
        // `\sqrt{x}` is `x^{1/2}` to sympy: a number.
        Expr::Call(Func::Sqrt | Func::Root, _) => false,
        Expr::Call(_, args) | Expr::Tuple(args) => !args.is_empty() && args.iter().all(only_names),
        _ => false,
    }
}

/// The last side of a relation chain.
pub(super) fn last_side(e: &Expr) -> &Expr {
    match e {
        Expr::Rel { terms, .. } => &terms[terms.len() - 1],
        other => other,
    }
}

/// The set a relation describes: an interval, or for bounds on an absolute value the interval
/// or union (`|x| < 2` is `(-2, 2)`, `|z - 1| > 2` is `(-\infty, -1) \cup (3, \infty)`).
pub(super) fn rel_to_set(e: &Expr) -> Option<Expr> {
    if let Expr::Rel { terms, ops } = e {
        if let Some(set) = super::abs_bounds::abs_bound_to_set(terms, ops) {
            return Some(set);
        }
    }
    rel_to_interval(e)
}

/// `a <= x < b` and `x > a` as intervals (for comparing against interval answers).
pub(super) fn rel_to_interval(e: &Expr) -> Option<Expr> {
    let Expr::Rel { terms, ops } = e else {
        return None;
    };
    let inf = || Expr::Inf;
    let neg_inf = || Expr::Neg(Box::new(Expr::Inf));
    let closed = |op: RelOp| matches!(op, RelOp::Le | RelOp::Ge);
    match (terms.len(), ops.as_slice()) {
        (3, [a, b]) if is_variable(&terms[1]) => {
            let up = |op: &RelOp| matches!(op, RelOp::Lt | RelOp::Le);
            let down = |op: &RelOp| matches!(op, RelOp::Gt | RelOp::Ge);
            if up(a) && up(b) {
                Some(interval(
                    terms[0].clone(),
                    terms[2].clone(),
                    closed(*a),
                    closed(*b),
                ))
            } else if down(a) && down(b) {
                Some(interval(
                    terms[2].clone(),
                    terms[0].clone(),
                    closed(*b),
                    closed(*a),
                ))
            } else {
                None
            }
        }
        (2, [op]) => {
            let (sym_left, other) = match (&terms[0], &terms[1]) {
                (v, x) if is_variable(v) => (true, x.clone()),
                (x, v) if is_variable(v) => (false, x.clone()),
                _ => return None,
            };
            // Normalise to `x op other`.
            let op = if sym_left { *op } else { flip(*op) };
            match op {
                RelOp::Gt | RelOp::Ge => Some(interval(other, inf(), closed(op), false)),
                RelOp::Lt | RelOp::Le => Some(interval(neg_inf(), other, false, closed(op))),
                // `x \ne 2`: everything but 2.
                RelOp::Ne => Some(Expr::Union(vec![
                    interval(neg_inf(), other.clone(), false, false),
                    interval(other, inf(), false, false),
                ])),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The bounded quantity of an inequality: a variable (`x`) or a function of variables (`f(x)`,
/// read as a product of names).
pub(super) fn is_variable(e: &Expr) -> bool {
    match e {
        Expr::Sym(_) => true,
        Expr::Mul(a, b) => is_variable(a) && is_variable(b),
        Expr::Call(f, args) => *f != Func::Abs && args.iter().all(is_variable),
        _ => false,
    }
}

pub(super) fn interval(lo: Expr, hi: Expr, lo_closed: bool, hi_closed: bool) -> Expr {
    Expr::Interval {
        lo: Box::new(lo),
        hi: Box::new(hi),
        lo_closed,
        hi_closed,
    }
}

pub(super) fn flip(op: RelOp) -> RelOp {
    match op {
        RelOp::Lt => RelOp::Gt,
        RelOp::Le => RelOp::Ge,
        RelOp::Gt => RelOp::Lt,
        RelOp::Ge => RelOp::Le,
        x => x,
    }
}

/// `(lhs, op, rhs)` with `>`/`>=` turned into `<`/`<=` by swapping sides.
pub(super) fn canonical(l: Expr, op: RelOp, r: Expr) -> (Expr, RelOp, Expr) {
    match op {
        RelOp::Gt | RelOp::Ge => (r, flip(op), l),
        _ => (l, op, r),
    }
}

pub(super) fn rel_equiv(g: &Expr, p: &Expr, o: &EquivOptions) -> bool {
    let (Expr::Rel { terms: gt, ops: go }, Expr::Rel { terms: pt, ops: po }) = (g, p) else {
        return false;
    };
    let single = |ops: &[RelOp]| ops.len() == 1 || ops.iter().all(|&x| x == RelOp::Eq);
    if !(single(go) && single(po)) {
        if go.len() != po.len() {
            return false;
        }
        // Term by term in the order written: math-verify pairs the relations of two chains in
        // order, so `5 > x > -3` does not answer `-3 < x < 5`.
        return go == po && ordered(gt, pt, o);
    }
    let (gl, gop, gr) = reduce_chain(gt, go);
    let (pl, pop, pr) = reduce_chain(pt, po);
    let (gl, gop, gr) = canonical(gl, gop, gr);
    let (pl, pop, pr) = canonical(pl, pop, pr);
    if gop != pop {
        return false;
    }
    // Same bare name on the left: compare the right sides (`x = 11` vs `x = 5 + 6`).
    if is_name(&gl) && gl == pl {
        return equiv(&gr, &pr, o);
    }
    if !(gl.is_scalar() && gr.is_scalar() && pl.is_scalar() && pr.is_scalar()) {
        return equiv(&gl, &pl, o) && equiv(&gr, &pr, o);
    }
    let dg = Expr::Sub(Box::new(gl.clone()), Box::new(gr.clone()));
    let dp = Expr::Sub(Box::new(pl.clone()), Box::new(pr.clone()));
    let mut syms = vec![];
    dg.symbols(&mut syms);
    dp.symbols(&mut syms);
    if syms.is_empty() {
        return equiv(&gl, &pl, o) && equiv(&gr, &pr, o);
    }
    // dg = c * dp for a constant c (c > 0 for inequalities, c != 0 for equations).
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x7e3_9e7);
    let mut ratio: Option<Complex64> = None;
    let mut agreeing = 0;
    for _ in 0..o.points * 3 {
        if timed_out(o) || agreeing >= o.points {
            break;
        }
        let env = if has_abs(&dg) || has_abs(&dp) {
            random_signed_env(&syms, &mut rng)
        } else {
            random_env(&syms, &mut rng)
        };
        let a = eval_complex(&dg, &env);
        let b = eval_complex(&dp, &env);
        if !finite(a) || !finite(b) {
            continue;
        }
        if b.norm() < 1e-9 || a.norm() < 1e-9 {
            if a.norm() < 1e-9 && b.norm() < 1e-9 {
                continue;
            }
            return false;
        }
        let r = a / b;
        match ratio {
            None => ratio = Some(r),
            Some(r0) => {
                if !close(r0, r, o.rel_tol.max(1e-7)) {
                    return false;
                }
            }
        }
        agreeing += 1;
    }
    match ratio {
        Some(r) if agreeing >= 3 => {
            let real = r.im.abs() <= 1e-9 * r.norm();
            match gop {
                RelOp::Eq | RelOp::Ne => real,
                _ => real && r.re > 0.0,
            }
        }
        _ => false,
    }
}
