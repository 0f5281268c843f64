//! Tokens of LaTeX and plain-text math. LaTeX spellings of one operator become one token
//! (`\le`, `\leq`, `<=`, `≤` are all `Le`); spacing and sizing commands are dropped here.
use anyhow::{bail, Result};

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// Digits with at most one decimal point (`12`, `1.5`, `.5`).
    Num(String),
    /// A run of ASCII letters in plain text; the parser splits it into names and variables.
    Letters(String),
    /// A LaTeX command name without the backslash, not one of those mapped to operators below.
    Cmd(String),
    /// The braced argument of `\text`, `\mbox`, `\textbf`, `\mathrm`, `\operatorname`, ...
    Text(String),
    Plus,
    Minus,
    PlusMinus,
    MinusPlus,
    Star,
    Slash,
    Caret,
    Underscore,
    Bang,
    Comma,
    Semicolon,
    Pipe,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `\\approx`: an equation when alone, dropped after an exact one (`x = 1/3 \\approx 0.33`).
    Approx,
    LParen,
    RParen,
    LBrack,
    RBrack,
    LBrace,
    RBrace,
    /// `\{` and `\}`
    LSet,
    RSet,
    Cup,
    Cap,
    In,
    Inf,
    Pi,
    Percent,
    Amp,
    /// `\\` (matrix row separator)
    RowSep,
    Prime,
}

/// Commands that are pure spacing or sizing and vanish.
const SKIP_CMDS: &[&str] = &[
    "left",
    "right",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "biggl",
    "biggr",
    "displaystyle",
    "textstyle",
    "quad",
    "qquad",
    "limits",
    "nolimits",
    "mathbf",
    "boldsymbol",
    "bm",
    "mathit",
    "mathsf",
    "mathcal",
    "mathbb",
    "rm",
    "bf",
    "it",
    "hline",
    "cr",
    "ensuremath",
    "phantom",
    "hbox",
    "vphantom",
];

const TEXT_CMDS: &[&str] = &[
    "text",
    "textrm",
    "textbf",
    "textit",
    "textnormal",
    "textsf",
    "texttt",
    "mbox",
    "mathrm",
    "operatorname",
    "emph",
];

pub fn lex(s: &str) -> Result<Vec<Tok>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(s.len() / 2 + 1);
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' | b'~' => i += 1,
            b'0'..=b'9' | b'.' => {
                let st = i;
                let mut dot = false;
                while i < b.len() && (b[i].is_ascii_digit() || (b[i] == b'.' && !dot)) {
                    if b[i] == b'.' {
                        // A dot not followed by a digit ends the number ("3." is 3).
                        if !(i + 1 < b.len() && b[i + 1].is_ascii_digit()) {
                            break;
                        }
                        dot = true;
                    }
                    i += 1;
                }
                if i == st {
                    if b.get(i + 1) == Some(&b'.') {
                        bail!("ellipsis in answer");
                    }
                    // A lone '.' (sentence punctuation, `\left.`): drop it.
                    i += 1;
                    continue;
                }
                out.push(Tok::Num(s[st..i].to_string()));
            }
            b'a'..=b'z' | b'A'..=b'Z' => {
                let st = i;
                while i < b.len() && b[i].is_ascii_alphabetic() {
                    i += 1;
                }
                out.push(Tok::Letters(s[st..i].to_string()));
            }
            b'\\' => {
                i += 1;
                if i >= b.len() {
                    break;
                }
                if !b[i].is_ascii_alphabetic() {
                    let t = match b[i] {
                        b'{' => Some(Tok::LSet),
                        b'}' => Some(Tok::RSet),
                        b'\\' => Some(Tok::RowSep),
                        b'%' => Some(Tok::Percent),
                        b'$' | b',' | b';' | b':' | b'!' | b' ' | b'>' => None,
                        b'|' => Some(Tok::Pipe),
                        other => bail!("unexpected character after backslash: {:?}", other as char),
                    };
                    i += 1;
                    if let Some(t) = t {
                        out.push(t);
                    }
                    continue;
                }
                let st = i;
                while i < b.len() && b[i].is_ascii_alphabetic() {
                    i += 1;
                }
                let name = &s[st..i];
                if SKIP_CMDS.contains(&name) {
                    continue;
                }
                if TEXT_CMDS.contains(&name) {
                    let (content, next) = braced(s, i)?;
                    i = next;
                    out.push(Tok::Text(content.trim().to_string()));
                    continue;
                }
                let t = match name {
                    "le" | "leq" | "leqslant" | "leqq" => Tok::Le,
                    "ge" | "geq" | "geqslant" | "geqq" => Tok::Ge,
                    "ne" | "neq" => Tok::Ne,
                    "lt" => Tok::Lt,
                    "gt" => Tok::Gt,
                    "cdot" | "times" | "ast" | "cdotp" => Tok::Star,
                    "div" => Tok::Slash,
                    "pm" => Tok::PlusMinus,
                    "mp" => Tok::MinusPlus,
                    "cup" => Tok::Cup,
                    "cap" => Tok::Cap,
                    "in" => Tok::In,
                    "infty" | "infin" => Tok::Inf,
                    "pi" => Tok::Pi,
                    "lbrace" => Tok::LSet,
                    "rbrace" => Tok::RSet,
                    "langle" => Tok::LParen,
                    "rangle" => Tok::RParen,
                    "lfloor" | "rfloor" | "lceil" | "rceil" => Tok::Cmd(name.to_string()),
                    "vert" | "lvert" | "rvert" | "mid" => Tok::Pipe,
                    "equiv" | "coloneqq" => Tok::Eq,
                    "approx" | "simeq" | "thickapprox" => Tok::Approx,
                    "circ" | "degree" => continue,
                    _ => Tok::Cmd(name.to_string()),
                };
                out.push(t);
            }
            _ => {
                let t = match c {
                    b'+' => Tok::Plus,
                    b'-' => Tok::Minus,
                    b'*' => Tok::Star,
                    b'/' => Tok::Slash,
                    b'^' => Tok::Caret,
                    b'_' => Tok::Underscore,
                    b'!' => {
                        if b.get(i + 1) == Some(&b'=') {
                            i += 1;
                            Tok::Ne
                        } else {
                            Tok::Bang
                        }
                    }
                    b',' => Tok::Comma,
                    b';' => Tok::Semicolon,
                    b'|' => Tok::Pipe,
                    b'=' => {
                        if b.get(i + 1) == Some(&b'=') {
                            i += 1;
                        }
                        Tok::Eq
                    }
                    b'<' => {
                        if b.get(i + 1) == Some(&b'=') {
                            i += 1;
                            Tok::Le
                        } else {
                            Tok::Lt
                        }
                    }
                    b'>' => {
                        if b.get(i + 1) == Some(&b'=') {
                            i += 1;
                            Tok::Ge
                        } else {
                            Tok::Gt
                        }
                    }
                    b'(' => Tok::LParen,
                    b')' => Tok::RParen,
                    b'[' => Tok::LBrack,
                    b']' => Tok::RBrack,
                    b'{' => Tok::LBrace,
                    b'}' => Tok::RBrace,
                    b'%' => Tok::Percent,
                    b'&' => Tok::Amp,
                    b'\'' => Tok::Prime,
                    // A ratio `a:b` is the quotient, as math-verify reads it.
                    b':' => Tok::Slash,
                    b'$' => {
                        i += 1;
                        continue;
                    }
                    _ if c >= 0x80 => {
                        let ch = s[i..].chars().next().unwrap_or(' ');
                        i += ch.len_utf8();
                        if ch == '²' || ch == '³' {
                            out.push(Tok::Caret);
                            out.push(Tok::Num(if ch == '²' { "2" } else { "3" }.into()));
                            continue;
                        }
                        match unicode_tok(ch) {
                            Some(Some(t)) => out.push(t),
                            Some(None) => {}
                            None => bail!("unexpected character {ch:?}"),
                        }
                        continue;
                    }
                    _ => bail!("unexpected character {:?}", c as char),
                };
                i += 1;
                out.push(t);
            }
        }
    }
    Ok(out)
}

/// `Some(None)`: a character to ignore.
fn unicode_tok(ch: char) -> Option<Option<Tok>> {
    Some(Some(match ch {
        'π' => Tok::Pi,
        '∞' => Tok::Inf,
        '≤' => Tok::Le,
        '≥' => Tok::Ge,
        '≠' => Tok::Ne,
        '×' | '·' | '⋅' | '∙' => Tok::Star,
        '÷' => Tok::Slash,
        '±' => Tok::PlusMinus,
        '∓' => Tok::MinusPlus,
        '∪' => Tok::Cup,
        '∩' => Tok::Cap,
        '∈' => Tok::In,
        '−' | '–' => Tok::Minus,
        '√' => Tok::Cmd("sqrt".into()),
        '≈' => Tok::Approx,
        '°' | '\u{a0}' | '\u{2009}' | '\u{202f}' => return Some(None),
        _ => return None,
    }))
}

/// The content of the `{...}` group starting at byte `i` (after optional spaces), and the index
/// just past its closing brace. A missing group reads one character (`\text x`).
pub fn braced(s: &str, mut i: usize) -> Result<(String, usize)> {
    let b = s.as_bytes();
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    if i >= b.len() {
        bail!("missing argument at end of input");
    }
    if b[i] != b'{' {
        let ch = s[i..].chars().next().unwrap_or(' ');
        return Ok((ch.to_string(), i + ch.len_utf8()));
    }
    let mut depth = 0usize;
    let st = i + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => {
                i += 2;
                continue;
            }
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Ok((s[st..i].to_string(), i + 1));
                }
            }
            _ => {}
        }
        i += 1;
    }
    bail!("unbalanced braces")
}
