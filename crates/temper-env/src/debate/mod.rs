//! Self-play debate: two debaters A and B from the same policy argue a task's question over
//! three rounds (R1 propose, R2 argue, R3 respond); a judge then picks a winner.
//!
//! Each debater is one token transcript. Its R2 (R3) prompt is its R1 (R2) prompt and
//! completion, then the chat template's continuation tokens (close the assistant turn, open a
//! user turn), the round's instruction around the opponent's R1 (R2) completion token ids,
//! spliced as sampled (its final EOS left out), and the opening of a new assistant turn.
pub mod env;
pub mod judge;

use crate::chat::{first_prompt, ChatTurns, Codec};
use crate::driver::{Answer, Ask, EnvGroup, Responder};
use crate::question_sets::{Question, RewardOutput, Task};
use crate::transcript::Transcript;
use anyhow::{bail, Result};
use judge::{confidence_verdict, judge_prompt, mock_verdict, parse_verdict, JudgeKind, Verdict};
use serde::Serialize;
use temper_rollout::SamplingParams;

/// The round instructions (each configurable as `env.<name>`).
#[derive(Clone, Debug, PartialEq)]
pub struct DebateTemplates {
    /// Appended to the question in R1; `{side}` is `A` or `B`.
    pub r1: String,
    /// Before and after the opponent's R1 tokens in the R2 user turn.
    pub r2_before: String,
    pub r2_after: String,
    /// Before and after the opponent's R2 tokens in the R3 user turn.
    pub r3_before: String,
    pub r3_after: String,
}

impl Default for DebateTemplates {
    fn default() -> Self {
        DebateTemplates {
            r1: "You are debater {side}. Propose your answer, then state how confident you are as \
                 <CONFIDENCE>0-100</CONFIDENCE>."
                .into(),
            r2_before: "Your opponent proposed:\n".into(),
            r2_after: "\n\nArgue for your answer and against your opponent's.".into(),
            r3_before: "Your opponent argued:\n".into(),
            r3_after: "\n\nRespond to your opponent's argument and restate your final answer."
                .into(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct DebateConfig {
    pub judge: JudgeKind,
    /// Sampling of the debaters (`n` is ignored: one sample per debater and round).
    pub params: SamplingParams,
    /// Sampling of a model judge (temperature 0.3 by default).
    pub judge_params: SamplingParams,
    pub templates: DebateTemplates,
    /// Token ids that end a turn (left out when a completion is spliced into the opponent's turn).
    pub eos_ids: Vec<i64>,
}

/// The judge's side of one debate (logged, never trained).
#[derive(Clone, Debug, Default, Serialize)]
pub struct JudgeRecord {
    pub prompt_tokens: Vec<i64>,
    pub completion_tokens: Vec<i64>,
    pub text: String,
}

/// One debate: two transcripts, their R1 task scores and the verdict.
pub struct Debate {
    pub seed: u64,
    pub agents: [Transcript; 2],
    pub r1_scores: Vec<RewardOutput>,
    pub verdict: Option<Verdict>,
    pub judge: JudgeRecord,
}

/// The debates about one question (they share a baseline).
pub struct DebateGroup<'a> {
    pub question: Question,
    pub debates: Vec<Debate>,
    task: &'a dyn Task,
    codec: &'a dyn Codec,
    turns: &'a ChatTurns,
    cfg: &'a DebateConfig,
    /// 1..=3 debater rounds, 4 the judge, 5 done.
    round: usize,
}

/// The per-request seed of debate `d`, `agent` (2 = the judge), `round`.
fn ask_seed(seed: u64, agent: u64, round: u64) -> u64 {
    temper_base::seed::mix_family(seed, agent, round, 0xD1B5_4A32_D192_ED03)
}

impl<'a> DebateGroup<'a> {
    /// `seeds[d]` seeds debate `d` (its debaters' draws, the judge's, the mock coin).
    pub fn new(
        question: Question,
        task: &'a dyn Task,
        codec: &'a dyn Codec,
        turns: &'a ChatTurns,
        cfg: &'a DebateConfig,
        seeds: &[u64],
    ) -> Result<Self> {
        let mut debates = vec![];
        for &seed in seeds {
            let prompt = |side: &str| -> Result<Vec<i64>> {
                let r1 = cfg.templates.r1.replace("{side}", side);
                first_prompt(codec, None, &format!("{}\n\n{r1}", question.prompt))
            };
            debates.push(Debate {
                seed,
                agents: [Transcript::new(prompt("A")?), Transcript::new(prompt("B")?)],
                r1_scores: vec![],
                verdict: None,
                judge: JudgeRecord::default(),
            });
        }
        Ok(DebateGroup {
            question,
            debates,
            task,
            codec,
            turns,
            cfg,
            round: 1,
        })
    }

    /// The completion of `agent`'s turn `k` without its final EOS (what the opponent reads).
    fn spliced(&self, d: usize, agent: usize, k: usize) -> Vec<i64> {
        let (ids, _) = self.debates[d].agents[agent].turn_completion(k);
        let mut ids = ids.to_vec();
        if ids.last().is_some_and(|t| self.cfg.eos_ids.contains(t)) {
            ids.pop();
        }
        ids
    }

    /// After round `k` (1 or 2): each debater's next user turn around the opponent's words.
    fn continue_debates(&mut self, k: usize) -> Result<()> {
        let t = &self.cfg.templates;
        let (before, after) = if k == 1 {
            (&t.r2_before, &t.r2_after)
        } else {
            (&t.r3_before, &t.r3_after)
        };
        for d in 0..self.debates.len() {
            for agent in 0..2 {
                let theirs = self.spliced(d, 1 - agent, k - 1);
                let own = self.debates[d].agents[agent]
                    .turn_completion(k - 1)
                    .0
                    .to_vec();
                let obs = self
                    .turns
                    .continuation(self.codec, &own, before, &theirs, after)?;
                self.debates[d].agents[agent].observe(&obs);
            }
        }
        Ok(())
    }

    fn texts(&self, d: usize) -> [[String; 3]; 2] {
        let t = |a: usize, k: usize| self.debates[d].agents[a].turns[k].text.clone();
        [[t(0, 0), t(0, 1), t(0, 2)], [t(1, 0), t(1, 1), t(1, 2)]]
    }

    /// Debates the judge could not decide.
    pub fn invalid(&self) -> usize {
        self.debates
            .iter()
            .filter(|d| d.verdict == Some(Verdict::Invalid))
            .count()
    }
}

impl EnvGroup for DebateGroup<'_> {
    fn asks(&mut self) -> Result<Vec<Ask>> {
        match self.round {
            1..=3 => {
                let (round, params) = (self.round as u64, &self.cfg.params);
                Ok(self
                    .debates
                    .iter()
                    .flat_map(|d| {
                        (0..2).map(move |a| Ask {
                            prompt_ids: d.agents[a].prompt().to_vec(),
                            params: SamplingParams {
                                n: 1,
                                seed: Some(ask_seed(d.seed, a as u64, round)),
                                ..params.clone()
                            },
                            responder: Responder::Policy,
                        })
                    })
                    .collect())
            }
            4 => {
                let responder = match self.cfg.judge {
                    JudgeKind::Policy => Responder::Policy,
                    JudgeKind::Model => Responder::Judge,
                    _ => unreachable!("sampled judges only reach round 4"),
                };
                let mut asks = vec![];
                for d in 0..self.debates.len() {
                    let prompt = judge_prompt(&self.question.prompt, &self.texts(d));
                    let ids = first_prompt(self.codec, None, &prompt)?;
                    self.debates[d].judge.prompt_tokens = ids.clone();
                    asks.push(Ask {
                        prompt_ids: ids,
                        params: SamplingParams {
                            n: 1,
                            seed: Some(ask_seed(self.debates[d].seed, 2, 4)),
                            ..self.cfg.judge_params.clone()
                        },
                        responder,
                    });
                }
                Ok(asks)
            }
            _ => Ok(vec![]),
        }
    }

    fn answer(&mut self, answers: Vec<Answer>) -> Result<()> {
        match self.round {
            1..=3 => {
                if answers.len() != 2 * self.debates.len() {
                    bail!(
                        "{} answers for {} debaters",
                        answers.len(),
                        2 * self.debates.len()
                    );
                }
                for (i, mut a) in answers.into_iter().enumerate() {
                    let (d, agent) = (i / 2, i % 2);
                    let (s, text) = (a.samples.remove(0), a.texts.remove(0));
                    if self.round == 1 {
                        let scored = self.task.score_question(&self.question, &text);
                        self.debates[d].r1_scores.push(scored);
                    }
                    self.debates[d].agents[agent].act(&s, text)?;
                }
                if self.round < 3 {
                    self.continue_debates(self.round)?;
                    self.round += 1;
                } else if self.cfg.judge.samples() {
                    self.round = 4;
                } else {
                    for d in 0..self.debates.len() {
                        let v = match self.cfg.judge {
                            JudgeKind::Mock => mock_verdict(self.debates[d].seed),
                            _ => {
                                let t = self.texts(d);
                                confidence_verdict(&t[0][0], &t[1][0])
                            }
                        };
                        self.debates[d].verdict = Some(v);
                    }
                    self.round = 5;
                }
            }
            4 => {
                for (d, mut a) in answers.into_iter().enumerate() {
                    let (s, text) = (a.samples.remove(0), a.texts.remove(0));
                    self.debates[d].verdict = Some(parse_verdict(&text));
                    self.debates[d].judge.completion_tokens = s.completion_ids;
                    self.debates[d].judge.text = text;
                }
                self.round = 5;
            }
            _ => bail!("answers after the debate ended"),
        }
        Ok(())
    }
}
