//! Recursive-descent parser from tokens to [`Expr`]. Precedence, loosest first: comma lists,
//! `\cup`, relations, `+ - \pm`, `* / implicit`, unary minus, `^` (right-assoc), postfix `!`.
use super::lexer::{lex, Tok};
use super::parser_atoms::{number, tok_text};
use super::{Expr, Func, RelOp};
use anyhow::{bail, Result};

const MAX_DEPTH: usize = 120;

/// Parse one answer (no surrounding prose) into an expression tree.
/// The parse error of an expression nested deeper than the parser goes (the grader leaves such
/// an answer unscored rather than calling it wrong).
#[derive(Debug)]
pub struct NestedTooDeeply;

impl std::fmt::Display for NestedTooDeeply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("expression nested too deeply")
    }
}

impl std::error::Error for NestedTooDeeply {}

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

pub(super) struct Parser {
    pub(super) toks: Vec<Tok>,
    pub(super) pos: usize,
    pub(super) depth: usize,
    pub(super) abs_depth: usize,
}

fn is_int_literal(e: &Expr) -> bool {
    matches!(e, Expr::Num { value, decimals: 0 } if value.is_integer())
}

/// How a run of factors joins the product before it: `Expr::Mul` or `Expr::Div`.
type JoinOp = fn(Box<Expr>, Box<Expr>) -> Expr;

/// The factors of a term written side by side since the last `*` or `/` (see `Parser::term`).
struct FactorRun {
    /// The product before the run and how the run joins it.
    before: Option<(Expr, JoinOp)>,
    factors: Vec<Expr>,
    /// Every factor is an integer literal (the first may carry a minus sign).
    all_int_literals: bool,
    /// A mixed number `3\frac{1}{2}` already closed the run as a sum.
    mixed: bool,
}

impl FactorRun {
    fn start(int_ahead: bool, first: Expr) -> Self {
        let signed_int = match &first {
            Expr::Neg(x) => is_int_literal(x),
            x => is_int_literal(x),
        };
        FactorRun {
            before: None,
            all_int_literals: int_ahead && signed_int,
            factors: vec![first],
            mixed: false,
        }
    }

    fn after(before: Expr, op: JoinOp, ahead: bool, first: Expr) -> Self {
        FactorRun {
            before: Some((before, op)),
            ..FactorRun::start(ahead, first)
        }
    }

    fn is_single_int(&self) -> bool {
        self.factors.len() == 1 && is_int_literal(&self.factors[0])
    }

    fn add_fraction(&mut self, frac: Expr) {
        let whole = self.factors.pop().unwrap();
        self.factors.push(Expr::Add(whole.bx(), frac.bx()));
        self.mixed = true;
        self.all_int_literals = false;
    }

    fn push(&mut self, int_ahead: bool, factor: Expr) {
        self.all_int_literals &= int_ahead && is_int_literal(&factor) && !self.mixed;
        self.factors.push(factor);
    }

    fn close(self) -> Expr {
        let mut factors = self.factors.into_iter();
        let first = factors.next().unwrap();
        let value = if self.all_int_literals && factors.len() > 0 {
            // `-2(3)` is -(2 + 3).
            let (negative, first) = match first {
                Expr::Neg(x) => (true, *x),
                x => (false, x),
            };
            let sum = factors.fold(first, |a, b| Expr::Add(a.bx(), b.bx()));
            if negative {
                Expr::Neg(sum.bx())
            } else {
                sum
            }
        } else {
            factors.fold(first, |a, b| Expr::Mul(a.bx(), b.bx()))
        };
        match self.before {
            Some((before, op)) => op(before.bx(), value.bx()),
            None => value,
        }
    }
}

impl Parser {
    pub(super) fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    pub(super) fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.pos + k)
    }

    pub(super) fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    pub(super) fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    pub(super) fn expect(&mut self, t: &Tok) -> Result<()> {
        if self.eat(t) {
            Ok(())
        } else {
            bail!("expected {t:?}, found {:?}", self.peek())
        }
    }

    pub(super) fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(NestedTooDeeply.into());
        }
        Ok(())
    }

    /// `x \in [0, 1)` is answered by its right-hand side.
    pub(super) fn skip_membership_prefix(&mut self) {
        let name_then_in = matches!(
            (self.peek(), self.peek_at(1)),
            (Some(Tok::Letters(_)) | Some(Tok::Cmd(_)), Some(Tok::In))
        );
        if name_then_in {
            self.pos += 2;
        }
    }

    pub(super) fn at_end_of_group(&self) -> bool {
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

    /// Comma- or semicolon-separated list; a single item is returned as itself. Semicolons
    /// that separate groups with commas in them separate solutions, each group one tuple
    /// (`m=3,n=1;m=5,n=1` is the two solutions `(m=3,n=1)` and `(m=5,n=1)`), as math-verify
    /// reads them; otherwise they are commas (`-12;-11;-10`).
    pub(super) fn list(&mut self) -> Result<Expr> {
        let mut groups: Vec<Vec<Expr>> = vec![vec![]];
        loop {
            let started = groups.iter().any(|g| !g.is_empty());
            if self.at_end_of_group() && started {
                break; // trailing comma
            }
            groups.last_mut().unwrap().push(self.union()?);
            if self.eat(&Tok::Comma) {
                continue;
            }
            if !self.eat(&Tok::Semicolon) {
                break;
            }
            groups.push(vec![]);
        }
        groups.retain(|g| !g.is_empty());
        if groups.len() > 1 && groups.iter().any(|g| g.len() > 1) {
            return Ok(Expr::List(groups.into_iter().map(Expr::Tuple).collect()));
        }
        let mut items: Vec<Expr> = groups.into_iter().flatten().collect();
        Ok(if items.len() == 1 {
            items.pop().unwrap()
        } else {
            Expr::List(items)
        })
    }

    pub(super) fn union(&mut self) -> Result<Expr> {
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

    pub(super) fn relop(&self) -> Option<RelOp> {
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

    pub(super) fn rel(&mut self) -> Result<Expr> {
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
            } else if ops.len() == 1 && !matches!(terms[0], Expr::Sym(_)) {
                // `\pi \approx 3.14` is `\pi` (`x \approx 3.14` stays `x = 3.14`), as math-verify
                // reads it.
                return Ok(terms.swap_remove(0));
            }
        }
        Ok(if ops.is_empty() {
            terms.pop().unwrap()
        } else {
            Expr::Rel { terms, ops }
        })
    }

    pub(super) fn sum(&mut self) -> Result<Expr> {
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

    pub(super) fn starts_atom(&self) -> bool {
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

    /// Products and quotients. Factors written side by side with no operator form a run; a run
    /// of integer literals alone (brackets allowed) is their sum, as latex2sympy reads it (a
    /// mixed number: `2(3)` is 5, `2(21)(19)` is 42, `2 \cdot 3 (4)` is `2 \cdot 7`), while a run
    /// with anything else in it is a product (`2(3)x`, `2(3)^2`, `2(-3)`, `1 000`: a literal
    /// with a leading zero is no mixed number).
    pub(super) fn term(&mut self) -> Result<Expr> {
        let mut run = FactorRun::start(self.int_literal_ahead(), self.unary()?);
        loop {
            match self.peek() {
                Some(Tok::Star) => {
                    self.pos += 1;
                    let ahead = self.int_literal_ahead();
                    run = FactorRun::after(run.close(), Expr::Mul, ahead, self.unary()?);
                }
                Some(Tok::Slash) => {
                    self.pos += 1;
                    let ahead = self.int_literal_ahead();
                    run = FactorRun::after(run.close(), Expr::Div, ahead, self.unary()?);
                }
                Some(Tok::Percent) => self.pos += 1,
                _ if self.starts_atom() => {
                    // Mixed numbers: `3\frac{1}{2}` means 3 + 1/2 (`7 3/4` is a product, as in math-verify).
                    if run.is_single_int() {
                        if let Some(frac) = self.try_mixed_fraction()? {
                            run.add_fraction(frac);
                            continue;
                        }
                    }
                    let ahead = self.int_literal_ahead();
                    let rhs = self.power()?;
                    run.push(ahead, rhs);
                }
                _ => break,
            }
        }
        Ok(run.close())
    }

    /// Whether the next factor starts with an integer literal that can join a mixed-number run
    /// (`3`, `(3)`, `[3]`, `{3}`; not `03`).
    fn int_literal_ahead(&self) -> bool {
        let literal = |t: Option<&Tok>| match t {
            Some(Tok::Num(n)) => {
                let leading_zero = n.len() > 1 && n.starts_with('0');
                !(n.contains('.') || leading_zero)
            }
            _ => false,
        };
        match self.peek() {
            Some(Tok::LParen | Tok::LBrack | Tok::LBrace) => literal(self.peek_at(1)),
            Some(Tok::Minus) => literal(self.peek_at(1)),
            t => literal(t),
        }
    }

    /// After an integer literal: `\frac{a}{b}` with integer literals a, b.
    pub(super) fn try_mixed_fraction(&mut self) -> Result<Option<Expr>> {
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
            _ => {}
        }
        self.pos = save;
        Ok(None)
    }

    /// A mixed number must stand alone (`2\frac{1}{2}x` is a product).
    pub(super) fn relop_or_end(&self) -> bool {
        self.at_end_of_group()
            || self.relop().is_some()
            || matches!(
                self.peek(),
                Some(Tok::Comma) | Some(Tok::Plus) | Some(Tok::Minus) | Some(Tok::Percent)
            )
    }

    pub(super) fn unary(&mut self) -> Result<Expr> {
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

    pub(super) fn power(&mut self) -> Result<Expr> {
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
    pub(super) fn exponent(&mut self) -> Result<Expr> {
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

    pub(super) fn postfix(&mut self) -> Result<Expr> {
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
    pub(super) fn subscript_text(&mut self) -> Result<String> {
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
}
