//! What the tests of temper's grader against math-verify's verdicts share: the labelled pair,
//! the tally per family or source with the check each must pass, and the disagreement dump.
use std::collections::BTreeMap;

use serde_json::Value;
use temper_reward::grader::{deliberate_difference, Grader};
use temper_reward::{Graded, GraderOptions};

/// One pair labelled by math-verify: `verify(parse(gold), parse(pred), **options)`.
pub struct Case {
    /// Where the text comes from (empty where the fixture does not say).
    pub source: String,
    pub family: String,
    /// `tune` or `heldout` (empty where the fixture is not split).
    pub split: String,
    pub gold: String,
    pub pred: String,
    pub options: Value,
    pub math_verify: bool,
}

impl Case {
    /// A fixture line: `family`, `gold`, `pred`, `math_verify`, and optional `options`,
    /// `source`, `split`.
    pub fn from_json(v: &Value) -> Case {
        let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        Case {
            source: text("source"),
            family: text("family"),
            split: text("split"),
            gold: text("gold"),
            pred: text("pred"),
            options: v.get("options").cloned().unwrap_or(Value::Null),
            math_verify: v["math_verify"].as_bool().unwrap(),
        }
    }
}

/// The lines of `tests/fixtures/<name>` as JSON.
pub fn fixture(name: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// One grader per distinct `options` of the cases, graded with it; disagreements are dumped.
#[derive(Default)]
pub struct Graders(BTreeMap<String, Grader>);

impl Graders {
    pub fn grade(&mut self, c: &Case) -> Graded {
        let grader = self
            .0
            .entry(c.options.to_string())
            .or_insert_with(|| Grader {
                options: GraderOptions::from_json(&c.options).unwrap(),
                ..Grader::default()
            });
        let graded = grader.grade(&c.gold, &c.pred);
        if graded.correct != c.math_verify {
            dump(c, &graded);
        }
        graded
    }
}

/// With `GRADER_DISAGREEMENTS=path`, every disagreement is appended to `path` as JSON (for
/// working on the grader; the tests do not read it).
fn dump(c: &Case, graded: &Graded) {
    let Ok(path) = std::env::var("GRADER_DISAGREEMENTS") else {
        return;
    };
    use std::io::Write;
    let line = serde_json::json!({
        "source": c.source, "family": c.family, "split": c.split, "gold": c.gold,
        "pred": c.pred, "options": c.options, "math_verify": c.math_verify,
        "gold_answer": graded.gold_answer, "pred_answer": graded.pred_answer,
    });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

/// Agreement of one family or source.
#[derive(Default)]
pub struct Stats {
    pub pairs: usize,
    pub agree: usize,
    pub false_accepts: usize,
    pub false_rejects: usize,
    /// Disagreements explained by a named deliberate rule, per rule.
    pub deliberate: BTreeMap<&'static str, usize>,
    pub examples: Vec<String>,
}

impl Stats {
    pub fn rate(&self) -> f64 {
        self.agree as f64 / self.pairs as f64
    }

    pub fn add(&mut self, c: &Case, ours: bool) {
        self.pairs += 1;
        if ours == c.math_verify {
            self.agree += 1;
            return;
        }
        if ours {
            self.false_accepts += 1;
        } else {
            self.false_rejects += 1;
        }
        if let Some(rule) = deliberate_difference(&c.gold, &c.pred) {
            *self.deliberate.entry(rule).or_default() += 1;
        }
        if self.examples.len() < 6 {
            let tail = |s: &str| s.chars().rev().take(160).collect::<Vec<_>>();
            let pred: String = tail(&c.pred).into_iter().rev().collect();
            self.examples.push(format!(
                "gold={:?} pred=...{:?} options={} math_verify={}",
                c.gold, pred, c.options, c.math_verify
            ));
        }
    }

    /// Every family's requirement: at least 97% agreement, no false accept, deliberate
    /// differences at most 1% of the pairs; `Err` names what is missed.
    pub fn check(&self, name: &str) -> Result<(), String> {
        let deliberate: usize = self.deliberate.values().sum();
        if self.rate() < 0.97
            || self.false_accepts > 0
            || deliberate as f64 > 0.01 * self.pairs as f64
        {
            return Err(format!(
                "{name}: {:.4}; e.g. {:#?}",
                self.rate(),
                self.examples
            ));
        }
        Ok(())
    }
}

pub fn print_table(title: &str, stats: &BTreeMap<String, Stats>) {
    println!("{title}");
    for (name, s) in stats {
        println!(
            "  {name:34} {:5}/{:5} = {:.4}  false accepts {:3}  false rejects {:3}  deliberate {:?}",
            s.agree,
            s.pairs,
            s.rate(),
            s.false_accepts,
            s.false_rejects,
            s.deliberate
        );
    }
}
