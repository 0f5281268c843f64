//! Sweeps: `-m actor.optim.lr=1e-6,1e-5 -m rollout.n=4,8` -> one run per combination.
use anyhow::{bail, Result};

/// One run of a sweep: the overrides that define it and a short tag for its folder name.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRun {
    pub overrides: Vec<String>,
    /// `key=value` parts joined by `,`, safe as a path component; empty for a single run.
    pub tag: String,
}

/// The cartesian product of the sweep options, first option varying slowest.
pub fn expand_sweeps(sweeps: &[String]) -> Result<Vec<SweepRun>> {
    let mut axes: Vec<(String, Vec<String>)> = Vec::new();
    for s in sweeps {
        let Some((k, v)) = s.split_once('=') else {
            bail!("sweep `{s}`: expected KEY=V1,V2,... (e.g. actor.optim.lr=1e-6,1e-5)");
        };
        let values = split_top_level(v.trim());
        if values.iter().any(|v| v.is_empty()) {
            bail!("sweep `{s}`: empty value in the list");
        }
        if axes.iter().any(|(a, _)| a == k.trim()) {
            bail!("sweep `{s}`: key `{}` is swept twice", k.trim());
        }
        axes.push((k.trim().to_string(), values));
    }
    let mut runs = vec![SweepRun {
        overrides: vec![],
        tag: String::new(),
    }];
    for (k, values) in &axes {
        let mut next = Vec::new();
        for run in &runs {
            for v in values {
                let mut r = run.clone();
                r.overrides.push(format!("{k}={v}"));
                let part = sanitize(&format!("{}={v}", k.rsplit('.').next().unwrap_or(k)));
                r.tag = if r.tag.is_empty() {
                    part
                } else {
                    format!("{},{part}", r.tag)
                };
                next.push(r);
            }
        }
        runs = next;
    }
    Ok(runs)
}

/// Splits on commas that are not inside brackets, braces or quotes (each part trimmed).
pub(super) fn split_top_level(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth, mut quote) = (Vec::new(), String::new(), 0i32, None::<char>);
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur.trim().to_string());
    out
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "=.-_+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}
