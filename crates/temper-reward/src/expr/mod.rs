//! A small computer-algebra core for grading: LaTeX / plain math -> expression tree, exact rational
//! evaluation where possible, complex floating-point evaluation at random points otherwise.
mod abs_bounds;
mod equiv;
mod eval;
mod lexer;
mod parser;
mod parser_atoms;
mod relations;

pub use equiv::{equivalent, EquivOptions};
pub use eval::{eval_complex, exact_value};
pub use parser::{parse, NestedTooDeeply};

use num_rational::BigRational;

/// Functions the engine knows how to evaluate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Func {
    Sin,
    Cos,
    Tan,
    Sec,
    Csc,
    Cot,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    Exp,
    /// Natural log (`\ln`, and `\log` without a base, as sympy and math-verify read it).
    Ln,
    /// `\log_b x`: arguments `[b, x]`.
    LogBase,
    Sqrt,
    /// `\sqrt[n]{x}`: arguments `[n, x]`.
    Root,
    Abs,
    Floor,
    Ceil,
    Factorial,
    /// `\binom{n}{k}`.
    Binom,
}

/// Comparison operators in equations and inequalities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// An answer as a tree. Scalars and the structures answers come in (tuples, sets, intervals,
/// equations, matrices) share one type so that they nest (`\{1 \pm \sqrt 5, -2\}`).
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// An exact number; `decimals` is the count of digits written after the decimal point (0 for
    /// integers and fractions), used to accept a rounded decimal against an exact value.
    Num {
        value: BigRational,
        decimals: u32,
    },
    /// A variable (single letter, Greek letter, or subscripted name such as `x_1`, `204_5`).
    Sym(String),
    Pi,
    E,
    I,
    /// Infinity, always with a sign given by an enclosing `Neg`.
    Inf,
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    Div(Box<Expr>, Box<Expr>),
    Pow(Box<Expr>, Box<Expr>),
    Neg(Box<Expr>),
    Call(Func, Vec<Expr>),
    /// `a \pm b`: both `a + b` and `a - b`.
    PlusMinus(Box<Expr>, Box<Expr>),
    /// Parenthesised comma list `(a, b)`: an ordered tuple (or an open interval).
    Tuple(Vec<Expr>),
    /// Bare comma list `a, b` (no brackets): compared without order against another bare list or
    /// a set, with order against a tuple.
    List(Vec<Expr>),
    /// `\{a, b\}`: compared without order.
    Set(Vec<Expr>),
    Interval {
        lo: Box<Expr>,
        hi: Box<Expr>,
        lo_closed: bool,
        hi_closed: bool,
    },
    Union(Vec<Expr>),
    /// A chain `a op b op c ...`: `terms.len() == ops.len() + 1`.
    Rel {
        terms: Vec<Expr>,
        ops: Vec<RelOp>,
    },
    Matrix(Vec<Vec<Expr>>),
    /// A word answer (`\text{Evelyn}`, `(C)`), compared case-insensitively.
    Text(String),
}

impl Expr {
    pub fn int(v: i64) -> Expr {
        Expr::Num {
            value: BigRational::from_integer(v.into()),
            decimals: 0,
        }
    }

    pub(crate) fn bx(self) -> Box<Expr> {
        Box::new(self)
    }

    /// Whether this is a single scalar (not a tuple, set, relation, ...).
    pub fn is_scalar(&self) -> bool {
        !matches!(
            self,
            Expr::Tuple(_)
                | Expr::List(_)
                | Expr::Set(_)
                | Expr::Interval { .. }
                | Expr::Union(_)
                | Expr::Rel { .. }
                | Expr::Matrix(_)
                | Expr::Text(_)
                | Expr::PlusMinus(..)
        )
    }

    /// The same tree with every variable renamed by `f`.
    pub fn map_symbols(&self, f: &dyn Fn(&str) -> String) -> Expr {
        use Expr::*;
        let m = |e: &Expr| e.map_symbols(f);
        let bx = |e: &Expr| Box::new(e.map_symbols(f));
        let all = |v: &[Expr]| v.iter().map(m).collect::<Vec<_>>();
        match self {
            Sym(s) => Sym(f(s)),
            Num { .. } | Pi | E | I | Inf | Text(_) => self.clone(),
            Add(a, b) => Add(bx(a), bx(b)),
            Sub(a, b) => Sub(bx(a), bx(b)),
            Mul(a, b) => Mul(bx(a), bx(b)),
            Div(a, b) => Div(bx(a), bx(b)),
            Pow(a, b) => Pow(bx(a), bx(b)),
            PlusMinus(a, b) => PlusMinus(bx(a), bx(b)),
            Neg(a) => Neg(bx(a)),
            Call(func, args) => Call(*func, all(args)),
            Tuple(v) => Tuple(all(v)),
            List(v) => List(all(v)),
            Set(v) => Set(all(v)),
            Union(v) => Union(all(v)),
            Rel { terms, ops } => Rel {
                terms: all(terms),
                ops: ops.clone(),
            },
            Interval {
                lo,
                hi,
                lo_closed,
                hi_closed,
            } => Interval {
                lo: bx(lo),
                hi: bx(hi),
                lo_closed: *lo_closed,
                hi_closed: *hi_closed,
            },
            Matrix(rows) => Matrix(rows.iter().map(|r| all(r)).collect()),
        }
    }

    /// Free variables, in first-seen order.
    pub fn symbols(&self, out: &mut Vec<String>) {
        match self {
            Expr::Sym(s) => {
                if !out.contains(s) {
                    out.push(s.clone())
                }
            }
            Expr::Num { .. } | Expr::Pi | Expr::E | Expr::I | Expr::Inf | Expr::Text(_) => {}
            Expr::Add(a, b)
            | Expr::Sub(a, b)
            | Expr::Mul(a, b)
            | Expr::Div(a, b)
            | Expr::Pow(a, b)
            | Expr::PlusMinus(a, b) => {
                a.symbols(out);
                b.symbols(out);
            }
            Expr::Neg(a) => a.symbols(out),
            Expr::Call(_, args)
            | Expr::Tuple(args)
            | Expr::List(args)
            | Expr::Set(args)
            | Expr::Union(args) => args.iter().for_each(|a| a.symbols(out)),
            Expr::Rel { terms, .. } => terms.iter().for_each(|a| a.symbols(out)),
            Expr::Interval { lo, hi, .. } => {
                lo.symbols(out);
                hi.symbols(out);
            }
            Expr::Matrix(rows) => rows.iter().flatten().for_each(|a| a.symbols(out)),
        }
    }
}
