//! `sat`: grail's seeded random 3-SAT. Problem `i` comes from the seed string `"{seed}:{i}"`
//! (SHA-256 of it seeds a ChaCha8 generator), and so does its difficulty `d` in [0, 1) (or
//! `env.difficulty`). As in grail: variables uniform in [4 + floor(11 d / 2), 4 + floor(11 d)],
//! clauses uniform in [5 + floor(15 d / 2), 5 + floor(15 d)], each clause 3 distinct variables,
//! each negated with probability 1/2. (Same distribution as grail's Python generator, not the
//! same draws: Python's Mersenne Twister is not reproduced.)
//!
//! The answer is `<SOLUTION>b1 b2 ... bN</SOLUTION>` with one 0/1 per variable. Reward (grail's
//! reward vector, weights 1 / 0.15 / 0.10 / 0.15 / 0.10 / 0.05):
//!   1.0  * correctness   1 if well formed and satisfying, 0 if well formed and not, -0.2 if not
//!                        well formed (one tag pair, only 0/1 and spaces, N bits, nothing after)
//! + 0.15 * strict        0.3 if well formed and the only tag pair
//! + 0.10 * soft          0.2 if a tag pair is present
//! + 0.15 * shape         0.3 if it holds exactly N bits
//! + 0.10 * no_trailing   max(0, 0.2 - 0.001 * characters after the closing tag), with a tag pair
//! + 0.05 * charset       0.1 if the tag content is only 0/1 and whitespace
//!
//! So a correct, clean answer scores 1 + 0.045 + 0.02 + 0.045 + 0.02 + 0.005 = 1.135.
use super::{opt_f64, opt_str, Question, RewardOutput, Task};
use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use sha2::{Digest, Sha256};
use temper_reward::Reward;

const MIN_VARS: usize = 4;
const MAX_VARS: usize = 15;
const MIN_CLAUSES: usize = 5;
const MAX_CLAUSES: usize = 20;

#[derive(Clone, Debug, PartialEq)]
pub struct SatProblem {
    pub num_vars: usize,
    /// Literals: +v or -v for variable v in 1..=num_vars.
    pub clauses: Vec<[i32; 3]>,
    pub difficulty: f64,
}

impl SatProblem {
    pub fn from_seed(seed: &str, difficulty: Option<f64>) -> Self {
        let digest: [u8; 32] = Sha256::digest(seed.as_bytes()).into();
        let mut rng = rand_chacha::ChaCha8Rng::from_seed(digest);
        let d: f64 = rng.random::<f64>();
        let d = difficulty.unwrap_or(d);
        let span = |lo: usize, hi: usize| {
            let a = lo + ((hi - lo) as f64 * d * 0.5) as usize;
            let b = lo + ((hi - lo) as f64 * d) as usize;
            (a, b.max(a))
        };
        let (va, vb) = span(MIN_VARS, MAX_VARS);
        let num_vars = rng.random_range(va..=vb);
        let (ca, cb) = span(MIN_CLAUSES, MAX_CLAUSES);
        let num_clauses = rng.random_range(ca..=cb);
        let clauses = (0..num_clauses)
            .map(|_| {
                let vars = rand::seq::index::sample(&mut rng, num_vars, 3);
                let mut c = [0i32; 3];
                for (k, v) in vars.iter().enumerate() {
                    let v = v as i32 + 1;
                    c[k] = if rng.random::<f64>() < 0.5 { -v } else { v };
                }
                c
            })
            .collect();
        SatProblem {
            num_vars,
            clauses,
            difficulty: d,
        }
    }

    pub fn satisfied_by(&self, bits: &[bool]) -> bool {
        bits.len() == self.num_vars
            && self.clauses.iter().all(|c| {
                c.iter()
                    .any(|&l| bits[l.unsigned_abs() as usize - 1] == (l > 0))
            })
    }

    /// Whether any assignment satisfies it (exhaustive: at most 2^15 assignments).
    pub fn satisfiable(&self) -> bool {
        (0u32..1 << self.num_vars).any(|m| {
            let bits: Vec<bool> = (0..self.num_vars).map(|i| m >> i & 1 == 1).collect();
            self.satisfied_by(&bits)
        })
    }

    pub fn text(&self) -> String {
        let mut s = format!("Variables: {}\nClauses:\n", self.num_vars);
        for c in &self.clauses {
            let lits: Vec<String> = c
                .iter()
                .map(|&l| format!("{}x{}", if l < 0 { "NOT " } else { "" }, l.abs()))
                .collect();
            s.push_str(&format!("  ({})\n", lits.join(" OR ")));
        }
        s
    }
}

pub struct Sat {
    seed: String,
    difficulty: Option<f64>,
    count: usize,
}

impl Sat {
    pub fn new(opts: &Value) -> Result<Self> {
        let difficulty = match opts.get("difficulty") {
            None | Some(Value::Null) => None,
            Some(_) => {
                let d = opt_f64(opts, "difficulty", 0.5)?;
                if !(0.0..=1.0).contains(&d) {
                    bail!("env.difficulty must be in [0, 1], got {d}");
                }
                Some(d)
            }
        };
        let count = opt_f64(opts, "num_problems", 10_000.0)?;
        if count < 1.0 {
            bail!("env.num_problems must be at least 1");
        }
        Ok(Sat {
            seed: opt_str(opts, "problem_seed", "temper-sat")?.to_string(),
            difficulty,
            count: count as usize,
        })
    }

    pub fn problem(&self, i: usize) -> SatProblem {
        SatProblem::from_seed(&format!("{}:{i}", self.seed), self.difficulty)
    }
}

/// The reward of `response` for `p` and its parts (module docs).
pub fn sat_reward(p: &SatProblem, response: &str) -> (f64, Vec<(&'static str, f64)>) {
    let (open, close) = ("<SOLUTION>", "</SOLUTION>");
    let opens = response.matches(open).count();
    let closes = response.matches(close).count();
    let pair = response.find(open).and_then(|a| {
        let start = a + open.len();
        response[start..].find(close).map(|b| (start, start + b))
    });
    let (content, trailing) = match pair {
        Some((a, b)) => (&response[a..b], response[b + close.len()..].chars().count()),
        None => ("", 0),
    };
    let has = pair.is_some();
    let only_bits = content
        .chars()
        .all(|c| c == '0' || c == '1' || c.is_whitespace());
    let bits: Vec<bool> = content
        .chars()
        .filter(|c| *c == '0' || *c == '1')
        .map(|c| c == '1')
        .collect();
    let well_formed = has && only_bits && trailing == 0 && bits.len() == p.num_vars;
    let correctness = if !well_formed {
        -0.2
    } else if p.satisfied_by(&bits) {
        1.0
    } else {
        0.0
    };
    let strict = if well_formed && opens == 1 && closes == 1 {
        0.3
    } else {
        0.0
    };
    let soft = if has { 0.2 } else { 0.0 };
    let shape = if has && bits.len() == p.num_vars {
        0.3
    } else {
        0.0
    };
    let no_trailing = if has {
        (0.2 - 0.001 * trailing as f64).max(0.0)
    } else {
        0.0
    };
    let charset = if has && only_bits { 0.1 } else { 0.0 };
    let parts = vec![
        ("correctness", correctness),
        ("strict_format", strict),
        ("soft_format", soft),
        ("answer_shape", shape),
        ("no_trailing", no_trailing),
        ("charset", charset),
    ];
    let total = correctness
        + 0.15 * strict
        + 0.10 * soft
        + 0.15 * shape
        + 0.10 * no_trailing
        + 0.05 * charset;
    (total, parts)
}

impl Task for Sat {
    fn question_count(&self) -> Option<usize> {
        Some(self.count)
    }
    fn question(&self, _seed: u64, i: u64) -> Question {
        let i = i as usize;
        let p = self.problem(i);
        Question {
            id: format!("sat-{i}"),
            prompt: format!(
                "SAT Problem:\n{}\nProvide your final assignment between <SOLUTION></SOLUTION> as space-separated \
                 0/1 values for x1..x{} (e.g., <SOLUTION>0 1 0 1</SOLUTION>).",
                p.text(),
                p.num_vars
            ),
            answer: Some(format!("{}:{i}", self.seed)),
            metadata: Value::Null,
        }
    }
}

/// GRAIL's SAT reward; the answer names the problem (`seed:index`), regenerated to check.
impl Reward for Sat {
    fn name(&self) -> &str {
        "sat"
    }
    fn score(&self, _prompt: &str, response: &str, answer: &str, _meta: &Value) -> RewardOutput {
        let p = SatProblem::from_seed(answer, self.difficulty);
        let (reward, parts) = sat_reward(&p, response);
        let parse_failed = parts[0].1 < 0.0;
        RewardOutput {
            reward,
            metrics: parts.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            parse_failed,
            ..RewardOutput::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_per_seed_within_grails_ranges() {
        let a = SatProblem::from_seed("s:1", None);
        assert_eq!(a, SatProblem::from_seed("s:1", None));
        assert_ne!(a, SatProblem::from_seed("s:2", None));
        for i in 0..200 {
            let p = SatProblem::from_seed(&format!("x:{i}"), None);
            let d = p.difficulty;
            assert!((4 + (11.0 * d * 0.5) as usize..=4 + (11.0 * d) as usize).contains(&p.num_vars));
            assert!((5 + (15.0 * d * 0.5) as usize..=5 + (15.0 * d) as usize)
                .contains(&p.clauses.len()));
            for c in &p.clauses {
                let mut v: Vec<i32> = c.iter().map(|l| l.abs()).collect();
                v.sort();
                v.dedup();
                assert_eq!(v.len(), 3);
                assert!(v.iter().all(|&x| x >= 1 && x as usize <= p.num_vars));
            }
        }
        assert_eq!(SatProblem::from_seed("y", Some(0.0)).num_vars, 4);
    }

    #[test]
    fn reward_formula() {
        let p = SatProblem {
            num_vars: 3,
            clauses: vec![[1, 2, 3], [-1, 2, 3]],
            difficulty: 0.0,
        };
        let r = |s: &str| sat_reward(&p, s).0;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(r("<SOLUTION>0 1 0</SOLUTION>"), 1.135));
        // Well formed, wrong.
        assert!(close(r("<SOLUTION>0 0 0</SOLUTION>"), 0.135));
        // Trailing text: not well formed.
        assert!(close(
            r("<SOLUTION>0 1 0</SOLUTION>ok"),
            -0.2 + 0.02 + 0.045 + 0.1 * 0.198 + 0.005
        ));
        // Nothing.
        assert!(close(r("no idea"), -0.2));
    }
}
