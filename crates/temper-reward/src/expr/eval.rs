//! Evaluation: exact (rationals, for answers that are rational numbers) and complex floating
//! point (for everything else, at given values of the free variables).
use super::{Expr, Func};
use num_bigint::BigInt;
use num_complex::Complex64;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

/// Largest exponent / factorial argument evaluated exactly; beyond it, floating point decides.
const MAX_EXACT_EXP: u64 = 4096;
const MAX_EXACT_BITS: u64 = 1 << 16;

/// The exact rational value of a constant expression, if it has one that this engine can find
/// (integer powers, perfect roots, factorials, ...). `None` means "not known to be rational".
pub fn exact_value(e: &Expr) -> Option<BigRational> {
    Some(match e {
        Expr::Num { value, .. } => value.clone(),
        Expr::Add(a, b) => exact_value(a)? + exact_value(b)?,
        Expr::Sub(a, b) => exact_value(a)? - exact_value(b)?,
        Expr::Mul(a, b) => {
            let x = exact_value(a)?;
            if x.is_zero() && is_finite_expr(b) {
                return Some(x);
            }
            x * exact_value(b)?
        }
        Expr::Div(a, b) => {
            let d = exact_value(b)?;
            if d.is_zero() {
                return None;
            }
            exact_value(a)? / d
        }
        Expr::Neg(a) => -exact_value(a)?,
        Expr::Pow(a, b) => exact_pow(&exact_value(a)?, &exact_value(b)?)?,
        Expr::Call(f, args) => exact_call(*f, args)?,
        _ => return None,
    })
}

/// Whether an expression has no infinity in it (0 * inf is not 0).
fn is_finite_expr(e: &Expr) -> bool {
    !matches!(e, Expr::Inf)
}

fn bits(x: &BigRational) -> u64 {
    x.numer().bits().max(x.denom().bits())
}

fn exact_pow(base: &BigRational, exp: &BigRational) -> Option<BigRational> {
    if exp.is_integer() {
        let n = exp.to_integer();
        let mag = n.abs().to_u64()?;
        if mag > MAX_EXACT_EXP || bits(base).saturating_mul(mag) > MAX_EXACT_BITS {
            return None;
        }
        if base.is_zero() && n.is_negative() {
            return None;
        }
        let p = num_traits::pow(base.clone(), mag as usize);
        return Some(if n.is_negative() { p.recip() } else { p });
    }
    // Rational exponent p/q: exact only for a perfect q-th power.
    let q = exp.denom().to_u32()?;
    let root = exact_root(base, q)?;
    exact_pow(&root, &BigRational::from_integer(exp.numer().clone()))
}

/// The exact real q-th root of x, if x is a perfect q-th power of a rational.
fn exact_root(x: &BigRational, q: u32) -> Option<BigRational> {
    if q == 0 || q > 64 {
        return None;
    }
    let neg = x.is_negative();
    if neg && q.is_multiple_of(2) {
        return None;
    }
    let n = x.numer().abs();
    let d = x.denom().clone();
    let rn = n.nth_root(q);
    let rd = d.nth_root(q);
    if num_traits::pow(rn.clone(), q as usize) != n || num_traits::pow(rd.clone(), q as usize) != d
    {
        return None;
    }
    let r = BigRational::new(rn, rd);
    Some(if neg { -r } else { r })
}

fn exact_call(f: Func, args: &[Expr]) -> Option<BigRational> {
    let x = exact_value(args.last()?)?;
    Some(match f {
        Func::Sqrt => exact_root(&x, 2)?,
        Func::Root => {
            let n = exact_value(&args[0])?;
            if !n.is_integer() {
                return None;
            }
            exact_root(&x, n.to_integer().to_u32()?)?
        }
        Func::Abs => x.abs(),
        Func::Floor => BigRational::from_integer(x.floor().to_integer()),
        Func::Ceil => BigRational::from_integer(x.ceil().to_integer()),
        Func::Factorial => {
            if !x.is_integer() || x.is_negative() {
                return None;
            }
            let n = x.to_integer().to_u64()?;
            if n > MAX_EXACT_EXP {
                return None;
            }
            BigRational::from_integer((1..=n).fold(BigInt::one(), |a, k| a * k))
        }
        Func::Binom => {
            let n = exact_value(&args[0])?;
            let k = x;
            if !k.is_integer() || k.is_negative() {
                return None;
            }
            let k = k.to_integer().to_u64()?;
            if k > MAX_EXACT_EXP {
                return None;
            }
            let mut acc = BigRational::one();
            for j in 0..k {
                acc = acc * (n.clone() - BigRational::from_integer(j.into()))
                    / BigRational::from_integer((j + 1).into());
            }
            acc
        }
        Func::Exp if x.is_zero() => BigRational::one(),
        Func::Ln if x.is_one() => BigRational::zero(),
        Func::Sin | Func::Tan | Func::Asin | Func::Atan | Func::Sinh | Func::Tanh
            if x.is_zero() =>
        {
            BigRational::zero()
        }
        Func::Cos | Func::Cosh | Func::Sec if x.is_zero() => BigRational::one(),
        Func::LogBase => {
            // log_b x = k exactly when b^k == x for a small integer k.
            let b = exact_value(&args[0])?;
            if b <= BigRational::zero() || b.is_one() || x <= BigRational::zero() {
                return None;
            }
            let guess = (x.to_f64()?.ln() / b.to_f64()?.ln()).round();
            if !guess.is_finite() || guess.abs() > 4096.0 {
                return None;
            }
            let k = BigRational::from_integer(BigInt::from(guess as i64));
            if exact_pow(&b, &k)? == x {
                k
            } else {
                return None;
            }
        }
        _ => return None,
    })
}

fn c(re: f64) -> Complex64 {
    Complex64::new(re, 0.0)
}

const NAN: Complex64 = Complex64::new(f64::NAN, f64::NAN);

/// Complex value of a scalar expression with the free variables bound by `env`. Undefined
/// results (a variable not in `env`, division by zero, a non-scalar) are NaN.
pub fn eval_complex(e: &Expr, env: &[(String, Complex64)]) -> Complex64 {
    match e {
        Expr::Num { value, .. } => c(value.to_f64().unwrap_or(f64::NAN)),
        Expr::Sym(s) => env
            .iter()
            .find(|(k, _)| k == s)
            .map(|(_, v)| *v)
            .unwrap_or(NAN),
        Expr::Pi => c(std::f64::consts::PI),
        Expr::E => c(std::f64::consts::E),
        Expr::I => Complex64::new(0.0, 1.0),
        Expr::Inf => c(f64::INFINITY),
        Expr::Add(a, b) => eval_complex(a, env) + eval_complex(b, env),
        Expr::Sub(a, b) => eval_complex(a, env) - eval_complex(b, env),
        Expr::Mul(a, b) => eval_complex(a, env) * eval_complex(b, env),
        Expr::Div(a, b) => {
            let d = eval_complex(b, env);
            if d.norm() == 0.0 {
                NAN
            } else {
                eval_complex(a, env) / d
            }
        }
        Expr::Neg(a) => -eval_complex(a, env),
        Expr::Pow(a, b) => pow(eval_complex(a, env), eval_complex(b, env)),
        Expr::Call(f, args) => call(*f, args, env),
        _ => NAN,
    }
}

fn pow(a: Complex64, b: Complex64) -> Complex64 {
    if b.im == 0.0 && b.re.fract() == 0.0 && b.re.abs() <= 64.0 {
        if a.norm() == 0.0 && b.re < 0.0 {
            return NAN;
        }
        return a.powi(b.re as i32);
    }
    if a.im == 0.0 && b.im == 0.0 && a.re > 0.0 {
        return c(a.re.powf(b.re));
    }
    if a.norm() == 0.0 {
        return if b.re > 0.0 { c(0.0) } else { NAN };
    }
    a.powc(b)
}

fn call(f: Func, args: &[Expr], env: &[(String, Complex64)]) -> Complex64 {
    let Some(last) = args.last() else { return NAN };
    let x = eval_complex(last, env);
    match f {
        Func::Sin => x.sin(),
        Func::Cos => x.cos(),
        Func::Tan => x.tan(),
        Func::Sec => x.cos().inv(),
        Func::Csc => x.sin().inv(),
        Func::Cot => x.tan().inv(),
        Func::Asin => x.asin(),
        Func::Acos => x.acos(),
        Func::Atan => x.atan(),
        Func::Sinh => x.sinh(),
        Func::Cosh => x.cosh(),
        Func::Tanh => x.tanh(),
        Func::Exp => x.exp(),
        Func::Ln => x.ln(),
        Func::LogBase => x.ln() / eval_complex(&args[0], env).ln(),
        Func::Sqrt => x.sqrt(),
        Func::Root => {
            let n = eval_complex(&args[0], env);
            // Odd roots of negative reals are real (`\sqrt[3]{-8} = -2`), as in textbooks.
            if n.im == 0.0 && x.im == 0.0 && x.re < 0.0 && (n.re as i64) % 2 != 0 {
                c(-(-x.re).powf(1.0 / n.re))
            } else {
                pow(x, n.inv())
            }
        }
        Func::Abs => c(x.norm()),
        Func::Floor => c(x.re.floor()),
        Func::Ceil => c(x.re.ceil()),
        Func::Factorial => {
            if x.im == 0.0 && x.re >= 0.0 && x.re.fract() == 0.0 && x.re <= 170.0 {
                c((1..=x.re as u64).fold(1.0, |a, k| a * k as f64))
            } else {
                NAN
            }
        }
        Func::Binom => {
            let n = eval_complex(&args[0], env);
            if x.im != 0.0 || x.re < 0.0 || x.re.fract() != 0.0 || x.re > 1000.0 {
                return NAN;
            }
            let mut acc = c(1.0);
            for j in 0..x.re as u64 {
                acc = acc * (n - c(j as f64)) / c((j + 1) as f64);
            }
            acc
        }
    }
}
