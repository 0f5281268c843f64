//! Data loading: JSONL / Parquet (a pyarrow-written fixture), field mapping, bad input.
use temper_testkit as common;
use temper_train::config::DataConfig;
use temper_train::data::{load_dataset, load_file, DataOrder, Prompt};

fn cfg(prompt_key: &str, answer_key: &str, extract: &str) -> DataConfig {
    DataConfig {
        prompt_key: prompt_key.into(),
        answer_key: answer_key.into(),
        answer_extract: extract.parse().unwrap(),
        ..DataConfig::default()
    }
}

#[test]
fn gsm8k_jsonl_with_answer_extraction() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/gsm8k/test.jsonl");
    let ex = load_file(&path, &cfg("question", "answer", "gsm8k")).unwrap();
    assert_eq!(ex.len(), 1319);
    assert!(matches!(&ex[0].prompt, Prompt::Text(t) if t.starts_with("Janet")));
    assert_eq!(ex[0].answer, "18");
    assert!(ex
        .iter()
        .all(|e| !e.answer.contains(',') && !e.answer.is_empty()));
}

#[test]
fn verl_parquet_with_messages_and_nested_answer() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/verl_style.parquet");
    let ex = load_file(&path, &cfg("prompt", "reward_model.ground_truth", "none")).unwrap();
    assert_eq!(ex.len(), 2);
    assert_eq!(
        ex[0].prompt,
        Prompt::Messages(vec![("user".into(), "What is 2 + 3?".into())])
    );
    assert_eq!(ex[1].prompt.text(), "What is 10 - 4?");
    assert_eq!((ex[0].answer.as_str(), ex[1].answer.as_str()), ("5", "6"));
    assert_eq!(ex[1].metadata["extra_info"]["index"], 1);
    // Nested prompt text through a dotted key.
    let ex = load_file(
        &path,
        &cfg("extra_info.question", "reward_model.ground_truth", "none"),
    )
    .unwrap();
    assert_eq!(ex[1].prompt, Prompt::Text("What is 10 - 4?".into()));
    let e = load_file(&path, &cfg("prompt", "reward_model.answer", "none"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("verl_style.parquet row 1") && e.contains("reward_model.answer"),
        "{e}"
    );
}

#[test]
fn bad_records_name_file_line_and_field() {
    let dir = common::temp_dir("data");
    let p = dir.join("d.jsonl");
    std::fs::write(
        &p,
        "{\"question\": \"a\", \"answer\": \"1\"}\n\n{\"question\": \"b\"}\n",
    )
    .unwrap();
    let e = load_file(&p, &cfg("question", "answer", "none"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("d.jsonl line 3") && e.contains("missing field `answer`"),
        "{e}"
    );
    std::fs::write(&p, "{\"question\": \"a\", \"answer\": \"no hashes\"}\n").unwrap();
    let e = load_file(&p, &cfg("question", "answer", "gsm8k"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1") && e.contains("####"), "{e}");
    std::fs::write(&p, "{\"question\": \"a\", \"answer\": \"1\"}\n{not json\n").unwrap();
    let e = load_file(&p, &cfg("question", "answer", "none"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2") && e.contains("JSON"), "{e}");
    std::fs::write(&p, "\n").unwrap();
    let e = load_file(&p, &cfg("question", "answer", "none"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty dataset"), "{e}");
    let e = load_file(&dir.join("x.csv"), &cfg("q", "a", "none"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.csv"), "{e}");
}

#[test]
fn task_datasets_are_seeded_and_split() {
    let c = DataConfig {
        task: Some("arith".into()),
        task_train_size: 50,
        task_val_size: 10,
        ..DataConfig::default()
    };
    let a = load_dataset(&c, 1, true).unwrap().unwrap();
    let b = load_dataset(&c, 1, true).unwrap().unwrap();
    let other = load_dataset(&c, 2, true).unwrap().unwrap();
    let val = load_dataset(&c, 1, false).unwrap().unwrap();
    assert_eq!(a.len(), 50);
    assert_eq!(val.len(), 10);
    assert_eq!(a.examples, b.examples);
    assert_ne!(a.examples, other.examples);
    assert_ne!(a.examples[..10], val.examples[..]);
    let bad = DataConfig {
        task: Some("sudoku".into()),
        ..DataConfig::default()
    };
    assert!(format!("{:#}", load_dataset(&bad, 1, true).unwrap_err()).contains("data.task"));
}

#[test]
fn data_order_is_a_seeded_permutation_per_epoch() {
    let o = DataOrder {
        len: 10,
        batch_size: 3,
        shuffle: true,
        seed: 5,
    };
    assert_eq!(o.batches_per_epoch(), 3);
    let mut seen: Vec<usize> = (0..3).flat_map(|s| o.batch(s).1).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 9, "one epoch visits distinct examples");
    assert_eq!(o.batch(3).0, 1);
    assert_ne!(o.batch(0).1, o.batch(3).1, "epochs are reshuffled");
    assert_eq!(o.batch(4).1, o.batch(4).1);
    let plain = DataOrder {
        shuffle: false,
        ..o
    };
    assert_eq!(plain.batch(1).1, vec![3, 4, 5]);
}
