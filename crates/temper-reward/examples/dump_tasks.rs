//! Print generated task examples as JSON lines (input to tools/reward_task_fixtures.py, which
//! checks them independently in Python and writes the committed fixture).
use serde_json::{json, Value};
use temper_reward::procedural_task;

/// (task, options) pairs covered by the fixture.
pub fn configs() -> Vec<(&'static str, Value)> {
    vec![
        ("arith", json!({})),
        ("arith", json!({"digits": 3, "operands": 3, "ops": "+-*"})),
        ("arith", json!({"digits": 2, "ops": "/"})),
        (
            "arith",
            json!({"digits": 2, "operands": 4, "ops": "+-*/", "allow_negative": false}),
        ),
        ("chain_sum", json!({})),
        ("chain_sum", json!({"steps": 8, "digits": 2})),
        ("countdown", json!({})),
        (
            "countdown",
            json!({"numbers": 3, "max_number": 20, "max_target": 50}),
        ),
    ]
}

fn main() -> anyhow::Result<()> {
    for (name, opts) in configs() {
        let task = procedural_task(name, &opts)?;
        for seed in [0u64, 1, 12345] {
            for index in 0..8u64 {
                let ex = task.generate(seed, index);
                let line = json!({"task": name, "opts": opts, "seed": seed, "index": index,
                    "prompt": ex.prompt, "answer": ex.answer, "metadata": ex.metadata});
                println!("{line}");
            }
        }
    }
    Ok(())
}
