//! Recursive-descent parser from tokens to [`Expr`]. Precedence, loosest first: comma lists,
//! `\cup`, relations, `+ - \pm`, `* / implicit`, unary minus, `^` (right-assoc), postfix `!`.
use super::lexer::{lex, Tok};
use super::{Expr, Func, RelOp};
use anyhow::{anyhow, bail, Result};
use num_bigint::BigInt;
use num_rational::BigRational;

const MAX_DEPTH: usize = 120;

/// Parse one answer (no surrounding prose) into an expression tree.
pub fn parse(s: &str) -> Result<Expr> {
    let toks = lex(s)?;
    if toks.is_empty() {
        bail!("empty answer");
    }
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
        abs_depth: 0,
    };
    p.skip_membership_prefix();
    let e = p.list()?;
    if p.pos < p.toks.len() {
        bail!("unexpected token {:?} at position {}", p.toks[p.pos], p.pos);
    }
    Ok(e)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
    abs_depth: usize,
}

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

fn is_int_literal(e: &Expr) -> bool {
    matches!(e, Expr::Num { value, decimals: 0 } if value.is_integer())
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.pos + k)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, t: &Tok) -> Result<()> {
        if self.eat(t) {
            Ok(())
        } else {
            bail!("expected {t:?}, found {:?}", self.peek())
        }
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            bail!("expression nested too deeply");
        }
        Ok(())
    }

    /// `x \in [0, 1)` is answered by its right-hand side.
    fn skip_membership_prefix(&mut self) {
        let name_then_in = matches!(
            (self.peek(), self.peek_at(1)),
            (Some(Tok::Letters(_)) | Some(Tok::Cmd(_)), Some(Tok::In))
        );
        if name_then_in {
            self.pos += 2;
        }
    }

    fn at_end_of_group(&self) -> bool {
        matches!(
            self.peek(),
            None | Some(Tok::RParen)
                | Some(Tok::RBrack)
                | Some(Tok::RBrace)
                | Some(Tok::RSet)
                | Some(Tok::Amp)
                | Some(Tok::RowSep)
        )
    }

    /// Comma- or semicolon-separated list; a single item is returned as itself.
    fn list(&mut self) -> Result<Expr> {
        let mut items = vec![];
        loop {
            if self.at_end_of_group() && !items.is_empty() {
                break; // trailing comma
            }
            items.push(self.union()?);
            if !(self.eat(&Tok::Comma) || self.eat(&Tok::Semicolon)) {
                break;
            }
        }
        Ok(if items.len() == 1 {
            items.pop().unwrap()
        } else {
            Expr::List(items)
        })
    }

    fn union(&mut self) -> Result<Expr> {
        let first = self.rel()?;
        if self.peek() != Some(&Tok::Cup) {
            return Ok(first);
        }
        let mut parts = vec![first];
        while self.eat(&Tok::Cup) {
            parts.push(self.rel()?);
        }
        Ok(Expr::Union(parts))
    }

    fn relop(&self) -> Option<RelOp> {
        Some(match self.peek()? {
            Tok::Eq => RelOp::Eq,
            Tok::Ne => RelOp::Ne,
            Tok::Lt => RelOp::Lt,
            Tok::Le => RelOp::Le,
            Tok::Gt => RelOp::Gt,
            Tok::Ge => RelOp::Ge,
            Tok::Approx => RelOp::Eq,
            _ => return None,
        })
    }

    fn rel(&mut self) -> Result<Expr> {
        let first = self.sum()?;
        let mut terms = vec![first];
        let mut ops = vec![];
        let mut first_approx = None;
        while let Some(op) = self.relop() {
            if self.peek() == Some(&Tok::Approx) && first_approx.is_none() {
                first_approx = Some(ops.len());
            }
            self.pos += 1;
            ops.push(op);
            terms.push(self.sum()?);
        }
        // `x = 1/3 \approx 0.33`: the approximation after an exact relation is not the answer.
        if let Some(k) = first_approx {
            if k > 0 {
                ops.truncate(k);
                terms.truncate(k + 1);
            }
        }
        Ok(if ops.is_empty() {
            terms.pop().unwrap()
        } else {
            Expr::Rel { terms, ops }
        })
    }

    fn sum(&mut self) -> Result<Expr> {
        self.enter()?;
        let mut acc = self.term()?;
        loop {
            match self.peek() {
                Some(Tok::Plus) => {
                    self.pos += 1;
                    acc = Expr::Add(acc.bx(), self.term()?.bx());
                }
                Some(Tok::Minus) => {
                    self.pos += 1;
                    acc = Expr::Sub(acc.bx(), self.term()?.bx());
                }
                Some(Tok::PlusMinus) => {
                    self.pos += 1;
                    acc = Expr::PlusMinus(acc.bx(), self.term()?.bx());
                }
                Some(Tok::MinusPlus) => {
                    self.pos += 1;
                    acc = Expr::PlusMinus(acc.bx(), Expr::Neg(self.term()?.bx()).bx());
                }
                _ => break,
            }
        }
        self.depth -= 1;
        Ok(acc)
    }

    fn starts_atom(&self) -> bool {
        match self.peek() {
            Some(Tok::Num(_))
            | Some(Tok::Letters(_))
            | Some(Tok::Pi)
            | Some(Tok::LParen)
            | Some(Tok::LBrace)
            | Some(Tok::Text(_)) => true,
            Some(Tok::Cmd(c)) => !matches!(c.as_str(), "end" | "rfloor" | "rceil"),
            Some(Tok::Pipe) => self.abs_depth == 0,
            _ => false,
        }
    }

    fn term(&mut self) -> Result<Expr> {
        let mut acc = self.unary()?;
        loop {
            match self.peek() {
                Some(Tok::Star) => {
                    self.pos += 1;
                    acc = Expr::Mul(acc.bx(), self.unary()?.bx());
                }
                Some(Tok::Slash) => {
                    self.pos += 1;
                    acc = Expr::Div(acc.bx(), self.unary()?.bx());
                }
                Some(Tok::Percent) => self.pos += 1,
                _ if self.starts_atom() => {
                    // Mixed numbers: `3\frac{1}{2}` and `7 3/4` mean 3 + 1/2 and 7 + 3/4.
                    if is_int_literal(&acc) {
                        if let Some(frac) = self.try_mixed_fraction()? {
                            acc = Expr::Add(acc.bx(), frac.bx());
                            continue;
                        }
                    }
                    let rhs = self.power()?;
                    acc = Expr::Mul(acc.bx(), rhs.bx());
                }
                _ => break,
            }
        }
        Ok(acc)
    }

    /// After an integer literal: `\frac{a}{b}` or `a/b` with integer literals a, b.
    fn try_mixed_fraction(&mut self) -> Result<Option<Expr>> {
        let save = self.pos;
        match self.peek() {
            Some(Tok::Cmd(c)) if matches!(c.as_str(), "frac" | "dfrac" | "tfrac") => {
                let f = self.atom()?;
                if let Expr::Div(a, b) = &f {
                    if is_int_literal(a) && is_int_literal(b) && self.relop_or_end() {
                        return Ok(Some(f));
                    }
                }
            }
            Some(Tok::Num(_)) => {
                if let (Some(Tok::Num(a)), Some(Tok::Slash), Some(Tok::Num(b))) =
                    (self.peek(), self.peek_at(1), self.peek_at(2))
                {
                    if !a.contains('.') && !b.contains('.') {
                        let (a, b) = (number(a)?, number(b)?);
                        self.pos += 3;
                        if self.relop_or_end() {
                            return Ok(Some(Expr::Div(a.bx(), b.bx())));
                        }
                    }
                }
            }
            _ => {}
        }
        self.pos = save;
        Ok(None)
    }

    /// A mixed number must stand alone (`2\frac{1}{2}x` is a product).
    fn relop_or_end(&self) -> bool {
        self.at_end_of_group()
            || self.relop().is_some()
            || matches!(
                self.peek(),
                Some(Tok::Comma) | Some(Tok::Plus) | Some(Tok::Minus) | Some(Tok::Percent)
            )
    }

    fn unary(&mut self) -> Result<Expr> {
        self.enter()?;
        let r = match self.peek() {
            Some(Tok::Minus) => {
                self.pos += 1;
                Expr::Neg(self.unary()?.bx())
            }
            Some(Tok::Plus) => {
                self.pos += 1;
                self.unary()?
            }
            Some(Tok::PlusMinus) | Some(Tok::MinusPlus) => {
                self.pos += 1;
                Expr::PlusMinus(Expr::int(0).bx(), self.unary()?.bx())
            }
            _ => self.power()?,
        };
        self.depth -= 1;
        Ok(r)
    }

    fn power(&mut self) -> Result<Expr> {
        self.enter()?;
        let mut base = self.postfix()?;
        if self.eat(&Tok::Caret) {
            let exp = self.exponent()?;
            base = Expr::Pow(base.bx(), exp.bx());
            while self.eat(&Tok::Bang) {
                base = Expr::Call(Func::Factorial, vec![base]);
            }
        }
        self.depth -= 1;
        Ok(base)
    }

    /// The argument of `^`: a braced group, or one token (`x^2`, `e^x`), or a signed one (`x^-1`).
    fn exponent(&mut self) -> Result<Expr> {
        match self.peek() {
            Some(Tok::LBrace) | Some(Tok::LParen) => self.postfix(),
            Some(Tok::Minus) | Some(Tok::Plus) => {
                let neg = self.next() == Some(Tok::Minus);
                let e = self.exponent()?;
                Ok(if neg { Expr::Neg(e.bx()) } else { e })
            }
            Some(Tok::Num(n)) => {
                // `x^23` in LaTeX is x^2 * 3, but answers write `10^23` meaning the whole number
                // as often; follow plain-text reading (whole number).
                let n = n.clone();
                self.pos += 1;
                number(&n)
            }
            Some(Tok::Letters(w)) if w.len() > 1 => {
                // `e^x` reads one letter, unless the run is a known word (`e^sin x` is rare).
                let w = w.clone();
                let first = w[..1].to_string();
                self.toks[self.pos] = Tok::Letters(w[1..].to_string());
                Ok(self.letter_atom(&first))
            }
            _ => self.power(),
        }
    }

    fn postfix(&mut self) -> Result<Expr> {
        let mut e = self.atom()?;
        loop {
            match self.peek() {
                Some(Tok::Bang) => {
                    self.pos += 1;
                    e = Expr::Call(Func::Factorial, vec![e]);
                }
                Some(Tok::Prime) => {
                    self.pos += 1;
                    e = match e {
                        Expr::Sym(s) => Expr::Sym(format!("{s}'")),
                        other => other,
                    };
                }
                Some(Tok::Underscore) => {
                    self.pos += 1;
                    let sub = self.subscript_text()?;
                    e = match e {
                        Expr::Sym(s) => Expr::Sym(format!("{s}_{sub}")),
                        Expr::Num { value, .. } => Expr::Sym(format!("{value}_{sub}")),
                        other => bail!("subscript on {other:?}"),
                    };
                }
                _ => break,
            }
        }
        Ok(e)
    }

    /// The raw text of a subscript (`_1`, `_{10}`, `_{n+1}`), used in a variable's name.
    fn subscript_text(&mut self) -> Result<String> {
        if self.eat(&Tok::LBrace) {
            let mut depth = 1;
            let mut s = String::new();
            while let Some(t) = self.next() {
                match t {
                    Tok::LBrace => depth += 1,
                    Tok::RBrace => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(s);
                        }
                    }
                    _ => {}
                }
                s.push_str(&tok_text(&t));
            }
            bail!("unclosed subscript")
        } else {
            match self.next() {
                Some(Tok::Letters(w)) => {
                    // `x_ab` subscripts only the first letter.
                    if w.len() > 1 {
                        self.pos -= 1;
                        self.toks[self.pos] = Tok::Letters(w[1..].to_string());
                    }
                    Ok(w[..1].to_string())
                }
                Some(Tok::Num(n)) => {
                    if n.len() > 1 && !n.contains('.') {
                        self.pos -= 1;
                        self.toks[self.pos] = Tok::Num(n[1..].to_string());
                        return Ok(n[..1].to_string());
                    }
                    Ok(n)
                }
                Some(t) => Ok(tok_text(&t)),
                None => bail!("missing subscript"),
            }
        }
    }

    fn letter_atom(&mut self, w: &str) -> Expr {
        match w {
            "e" => Expr::E,
            "i" => Expr::I,
            _ => Expr::Sym(w.to_string()),
        }
    }

    fn atom(&mut self) -> Result<Expr> {
        self.enter()?;
        let r = self.atom_inner();
        self.depth -= 1;
        r
    }

    fn atom_inner(&mut self) -> Result<Expr> {
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

    fn text_atom(&mut self, t: String) -> Result<Expr> {
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
    fn letters(&mut self, w: String) -> Result<Expr> {
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
    fn bracketed(&mut self, open_square: bool) -> Result<Expr> {
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
    fn arg(&mut self) -> Result<Expr> {
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
    fn func_arg(&mut self) -> Result<Expr> {
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

    fn apply_func(&mut self, f: Func) -> Result<Expr> {
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

    fn command(&mut self, c: &str) -> Result<Expr> {
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
            "emptyset" | "varnothing" => Ok(Expr::Set(vec![])),
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
    fn environment(&mut self) -> Result<Expr> {
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

    fn env_name(&mut self) -> Result<String> {
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

fn tok_text(t: &Tok) -> String {
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
