//! Grade one pair from the command line and show what was read: `cargo run -p temper-reward
//! --example grade_pair -- GOLD PRED` (for working on the grader).
use temper_reward::expr::parse;
use temper_reward::normalize::normalize;
use temper_reward::Grader;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (gold, pred) = (&args[1], &args[2]);
    let g = Grader::default().grade(gold, pred);
    println!("{g:?}");
    for a in [&g.gold_answer, &g.pred_answer].into_iter().flatten() {
        let n = normalize(a);
        println!("{n:?} -> {:?}", parse(&n));
    }
}
