//! The parser's atoms: numbers, letters and names, brackets, function arguments, LaTeX
//! commands and `\begin{..}` environments (precedence levels are in `parser.rs`).
use super::lexer::Tok;
use super::parser::Parser;
use super::{Expr, Func};
use anyhow::{anyhow, bail, Result};
use num_bigint::BigInt;
use num_rational::BigRational;

/// Plain-text names recognised inside a run of letters, longest first.
const WORDS: &[&str] = &[
    "arcsin", "arccos", "arctan", "sqrt", "sinh", "cosh", "tanh", "infty", "sin", "cos", "tan",
    "sec", "csc", "cot", "log", "exp", "abs", "inf", "ln", "pi", "oo",
];

fn func_of(name: &str) -> Option<Func> {
    Some(match name {
        "sin" => Func::Sin,
        "cos" => Func::Cos,
        "tan" => Func::Tan,
        "sec" => Func::Sec,
        "csc" | "cosec" => Func::Csc,
        "cot" | "cotan" => Func::Cot,
        "arcsin" | "asin" => Func::Asin,
        "arccos" | "acos" => Func::Acos,
        "arctan" | "atan" => Func::Atan,
        "sinh" => Func::Sinh,
        "cosh" => Func::Cosh,
        "tanh" => Func::Tanh,
        "exp" => Func::Exp,
        "ln" | "log" | "lg" => Func::Ln,
        "sqrt" => Func::Sqrt,
        "abs" => Func::Abs,
        _ => return None,
    })
}

fn inverse(f: Func) -> Option<Func> {
    Some(match f {
        Func::Sin => Func::Asin,
        Func::Cos => Func::Acos,
        Func::Tan => Func::Atan,
        _ => return None,
    })
}

pub(crate) fn number(s: &str) -> Result<Expr> {
    let (int, frac) = match s.find('.') {
        Some(k) => (&s[..k], &s[k + 1..]),
        None => (s, ""),
    };
    let digits = format!("{int}{frac}");
    let n: BigInt = if digits.is_empty() {
        BigInt::from(0)
    } else {
        digits.parse().map_err(|_| anyhow!("bad number {s:?}"))?
    };
    let d = BigInt::from(10).pow(frac.len() as u32);
    Ok(Expr::Num {
        value: BigRational::new(n, d),
        decimals: frac.len() as u32,
    })
}

impl Parser {
    pub(super) fn letter_atom(&mut self, w: &str) -> Expr {
        match w {
            "e" => Expr::E,
            // math-verify 0.9.0 reads `i` as a variable, never as the imaginary unit
            // (`i^2` does not answer `-1`, `3+4i` still answers `4i+3`).
            "i" => Expr::Sym("i".into()),
            _ => Expr::Sym(w.to_string()),
        }
    }

    pub(super) fn atom(&mut self) -> Result<Expr> {
        self.enter()?;
        let r = self.atom_inner();
        self.depth -= 1;
        r
    }

    pub(super) fn atom_inner(&mut self) -> Result<Expr> {
        let t = self
            .next()
            .ok_or_else(|| anyhow!("unexpected end of answer"))?;
        match t {
            Tok::Num(n) => number(&n),
            Tok::Pi => Ok(Expr::Pi),
            Tok::Inf => Ok(Expr::Inf),
            Tok::Letters(w) => self.letters(w),
            Tok::Text(t) => self.text_atom(t),
            Tok::Cmd(c) => self.command(&c),
            Tok::LParen => self.bracketed(false),
            Tok::LBrack => self.bracketed(true),
            Tok::LBrace => {
                let e = if self.peek() == Some(&Tok::RBrace) {
                    Expr::List(vec![])
                } else {
                    self.list()?
                };
                self.expect(&Tok::RBrace)?;
                Ok(e)
            }
            Tok::LSet => {
                let items = if self.peek() == Some(&Tok::RSet) {
                    vec![]
                } else {
                    match self.list()? {
                        Expr::List(v) => v,
                        e => vec![e],
                    }
                };
                self.expect(&Tok::RSet)?;
                Ok(Expr::Set(items))
            }
            Tok::Pipe => {
                self.abs_depth += 1;
                let e = self.sum();
                self.abs_depth -= 1;
                let e = e?;
                self.expect(&Tok::Pipe)?;
                Ok(Expr::Call(Func::Abs, vec![e]))
            }
            other => bail!("unexpected token {other:?}"),
        }
    }

    pub(super) fn text_atom(&mut self, t: String) -> Result<Expr> {
        let trimmed = t.trim();
        if let Some(f) = func_of(trimmed) {
            return self.apply_func(f);
        }
        if !trimmed.is_empty() && trimmed.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
            return number(trimmed);
        }
        if trimmed.chars().count() == 1 && trimmed.chars().all(|c| c.is_alphabetic()) {
            return Ok(Expr::Sym(trimmed.to_string()));
        }
        Ok(Expr::Text(trimmed.to_string()))
    }

    /// A plain-text run of letters: known names (`sqrt`, `sin`, `pi`) and otherwise one variable
    /// per letter, multiplied (`xy` is x*y).
    pub(super) fn letters(&mut self, w: String) -> Result<Expr> {
        let mut parts: Vec<Expr> = vec![];
        let mut rest = w.as_str();
        while !rest.is_empty() {
            if let Some(word) = WORDS.iter().find(|k| rest.starts_with(**k)) {
                rest = &rest[word.len()..];
                match *word {
                    "pi" => parts.push(Expr::Pi),
                    "inf" | "infty" | "oo" => parts.push(Expr::Inf),
                    name => {
                        let f = func_of(name).expect("listed word is a function");
                        if !rest.is_empty() {
                            // `sinx`: the remaining letters are the argument.
                            self.toks.insert(self.pos, Tok::Letters(rest.to_string()));
                        }
                        parts.push(self.apply_func(f)?);
                        rest = "";
                    }
                }
            } else {
                let ch = &rest[..1];
                rest = &rest[1..];
                parts.push(self.letter_atom(ch));
            }
        }
        let mut it = parts.into_iter();
        let first = it.next().ok_or_else(|| anyhow!("empty word"))?;
        Ok(it.fold(first, |a, b| Expr::Mul(a.bx(), b.bx())))
    }

    /// `( ... )` or `[ ... ]`, closed by either bracket: group, tuple or interval.
    pub(super) fn bracketed(&mut self, open_square: bool) -> Result<Expr> {
        let inner = self.list()?;
        let close_square = match self.next() {
            Some(Tok::RParen) => false,
            Some(Tok::RBrack) => true,
            other => bail!("expected closing bracket, found {other:?}"),
        };
        match inner {
            Expr::List(mut items) => {
                if items.len() == 2 && (open_square || close_square) {
                    let hi = items.pop().unwrap();
                    let lo = items.pop().unwrap();
                    Ok(Expr::Interval {
                        lo: lo.bx(),
                        hi: hi.bx(),
                        lo_closed: open_square,
                        hi_closed: close_square,
                    })
                } else if !open_square && !close_square {
                    Ok(Expr::Tuple(items))
                } else {
                    bail!("bracket list of {} items", items.len())
                }
            }
            e => Ok(e),
        }
    }

    /// The argument of a command: a braced group or a single token (`\frac12`, `\sqrt3`).
    pub(super) fn arg(&mut self) -> Result<Expr> {
        if self.eat(&Tok::LBrace) {
            let e = self.list()?;
            self.expect(&Tok::RBrace)?;
            return Ok(e);
        }
        match self.next() {
            Some(Tok::Num(n)) => {
                // `\frac12`: each argument is one digit.
                if n.len() > 1 && !n.contains('.') {
                    self.pos -= 1;
                    self.toks[self.pos] = Tok::Num(n[1..].to_string());
                    return number(&n[..1]);
                }
                number(&n)
            }
            Some(Tok::Letters(w)) => {
                if w.len() > 1 {
                    self.pos -= 1;
                    self.toks[self.pos] = Tok::Letters(w[1..].to_string());
                }
                Ok(self.letter_atom(&w[..1]))
            }
            Some(_) => {
                self.pos -= 1;
                self.atom()
            }
            None => bail!("missing argument"),
        }
    }

    /// Function argument without braces: `\sin x`, `\sin 2x`, `\log(x+1)`, `\sqrt{x}`.
    pub(super) fn func_arg(&mut self) -> Result<Expr> {
        // `\cos(x)^2` squares the cosine: a bracketed argument ends at its bracket.
        if matches!(self.peek(), Some(Tok::LParen) | Some(Tok::LBrace)) {
            return self.postfix();
        }
        let mut acc = self.power()?;
        while matches!(
            self.peek(),
            Some(Tok::Num(_)) | Some(Tok::Letters(_)) | Some(Tok::Pi)
        ) {
            acc = Expr::Mul(acc.bx(), self.power()?.bx());
        }
        Ok(acc)
    }

    pub(super) fn apply_func(&mut self, f: Func) -> Result<Expr> {
        // `\sin^2 x` squares the result; `\sin^{-1} x` is the inverse function.
        let mut pow = None;
        let mut f = f;
        if self.eat(&Tok::Caret) {
            let e = self.exponent()?;
            let is_minus_one = matches!(&e, Expr::Neg(x) if **x == Expr::int(1));
            match (is_minus_one, inverse(f)) {
                (true, Some(inv)) => f = inv,
                _ => pow = Some(e),
            }
        }
        let mut base = None;
        if f == Func::Ln && self.eat(&Tok::Underscore) {
            base = Some(self.arg()?);
        }
        let x = self.func_arg()?;
        let call = match base {
            Some(b) => Expr::Call(Func::LogBase, vec![b, x]),
            None => Expr::Call(f, vec![x]),
        };
        Ok(match pow {
            Some(p) => Expr::Pow(call.bx(), p.bx()),
            None => call,
        })
    }

    pub(super) fn command(&mut self, c: &str) -> Result<Expr> {
        if let Some(f) = func_of(c) {
            if f == Func::Sqrt {
                if self.eat(&Tok::LBrack) {
                    let n = self.list()?;
                    self.expect(&Tok::RBrack)?;
                    let x = self.arg()?;
                    return Ok(Expr::Call(Func::Root, vec![n, x]));
                }
                let x = self.arg()?;
                return Ok(Expr::Call(Func::Sqrt, vec![x]));
            }
            return self.apply_func(f);
        }
        match c {
            "frac" | "dfrac" | "tfrac" | "cfrac" => {
                let a = self.arg()?;
                let b = self.arg()?;
                Ok(Expr::Div(a.bx(), b.bx()))
            }
            "binom" | "dbinom" | "tbinom" => {
                let a = self.arg()?;
                let b = self.arg()?;
                Ok(Expr::Call(Func::Binom, vec![a, b]))
            }
            "lfloor" | "lceil" => {
                let e = self.sum()?;
                let close = if c == "lfloor" { "rfloor" } else { "rceil" };
                self.expect(&Tok::Cmd(close.into()))?;
                let f = if c == "lfloor" {
                    Func::Floor
                } else {
                    Func::Ceil
                };
                Ok(Expr::Call(f, vec![e]))
            }
            "overline" | "bar" | "hat" | "vec" | "tilde" | "widehat" | "underline" | "boxed"
            | "fbox" | "mathbf" => self.arg(),
            "emptyset" => Ok(Expr::Set(vec![])),
            "begin" => self.environment(),
            "e" => Ok(Expr::E),
            "infty" => Ok(Expr::Inf),
            "dots" | "ldots" | "cdots" | "vdots" | "ddots" => bail!("ellipsis in answer"),
            "sech" | "csch" | "coth" | "arcsec" | "arccsc" | "arccot" | "max" | "min" | "gcd"
            | "lcm" | "det" | "mod" | "pmod" | "bmod" | "int" | "sum" | "prod" | "lim" | "to"
            | "rightarrow" | "Rightarrow" | "implies" | "iff" | "forall" | "exists" | "angle"
            | "triangle" | "perp" | "parallel" | "cong" | "sim" => {
                bail!("unsupported command \\{c}")
            }
            // Greek letters and other named symbols are variables.
            _ => Ok(Expr::Sym(c.to_string())),
        }
    }

    /// `\begin{pmatrix} a & b \\ c & d \end{pmatrix}` (also bmatrix, matrix, array, ...).
    pub(super) fn environment(&mut self) -> Result<Expr> {
        let name = self.env_name()?;
        if name == "array" && self.peek() == Some(&Tok::LBrace) {
            // Column spec `{cc}` or `{c|c}`.
            self.pos += 1;
            while let Some(t) = self.next() {
                if t == Tok::RBrace {
                    break;
                }
            }
        }
        let mut rows: Vec<Vec<Expr>> = vec![];
        let mut row: Vec<Expr> = vec![];
        loop {
            match self.peek() {
                Some(Tok::Cmd(c)) if c == "end" => {
                    self.pos += 1;
                    let end = self.env_name()?;
                    if end != name {
                        bail!("\\begin{{{name}}} closed by \\end{{{end}}}");
                    }
                    break;
                }
                None => bail!("unclosed \\begin{{{name}}}"),
                _ => {}
            }
            if self.eat(&Tok::RowSep) {
                if !row.is_empty() {
                    rows.push(std::mem::take(&mut row));
                }
                continue;
            }
            if self.eat(&Tok::Amp) {
                continue;
            }
            row.push(self.union()?);
        }
        if !row.is_empty() {
            rows.push(row);
        }
        if rows.is_empty() {
            bail!("empty matrix");
        }
        let w = rows[0].len();
        if rows.iter().any(|r| r.len() != w) {
            bail!("ragged matrix");
        }
        Ok(Expr::Matrix(rows))
    }

    pub(super) fn env_name(&mut self) -> Result<String> {
        self.expect(&Tok::LBrace)?;
        let mut name = String::new();
        while let Some(t) = self.next() {
            match t {
                Tok::RBrace => return Ok(name),
                Tok::Letters(w) => name.push_str(&w),
                Tok::Star => name.push('*'),
                other => bail!("bad environment name token {other:?}"),
            }
        }
        bail!("unclosed environment name")
    }
}

pub(super) fn tok_text(t: &Tok) -> String {
    match t {
        Tok::Num(s) | Tok::Letters(s) | Tok::Text(s) => s.clone(),
        Tok::Cmd(c) => format!("\\{c}"),
        Tok::Plus => "+".into(),
        Tok::Minus => "-".into(),
        Tok::Comma => ",".into(),
        Tok::Star => "*".into(),
        Tok::Slash => "/".into(),
        Tok::LParen => "(".into(),
        Tok::RParen => ")".into(),
        Tok::Pi => "\\pi".into(),
        other => format!("{other:?}"),
    }
}
