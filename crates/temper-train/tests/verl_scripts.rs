//! verl's own GRPO-family run scripts (tests/fixtures/verl_scripts.txt: every key=value override
//! of 47 example and recipe scripts, as data) against temper's config:
//! - every key is mapped to a temper setting, ignored with a reason, or refused with a reason,
//!   and every ignored or refused entry is listed with its reason in docs/training.md, whose
//!   counts are those measured here;
//! - each script's whole command line loads, or fails naming a key temper refuses.
use std::collections::BTreeMap;
use temper_train::config::verl_keys::{IGNORED, REFUSED, REFUSED_VALUES};
use temper_train::config::{classify_key, load_config_str, parse_hydra_override, KeyClass};

const BASE: &str = "[model]\npath = \"m\"\n[data]\ntask = \"arithmetic\"\n";

struct Script {
    path: String,
    lines: Vec<String>,
}

fn scripts() -> Vec<Script> {
    let mut out: Vec<Script> = Vec::new();
    for line in include_str!("fixtures/verl_scripts.txt").lines() {
        if let Some(path) = line.strip_prefix("## ") {
            out.push(Script {
                path: path.to_string(),
                lines: Vec::new(),
            });
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            out.last_mut().unwrap().lines.push(line.to_string());
        }
    }
    out
}

fn docs() -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/training.md");
    std::fs::read_to_string(p).unwrap()
}

fn class_of(line: &str) -> (String, KeyClass) {
    let ov = parse_hydra_override(line).unwrap();
    let class = classify_key(&ov.key, ov.value.as_ref());
    (ov.key, class)
}

#[test]
fn every_key_of_verls_scripts_is_mapped_ignored_or_refused_and_documented() {
    let scripts = scripts();
    assert!(scripts.len() >= 20);
    // key -> (class name, first line that sets it)
    let mut keys: BTreeMap<String, (&str, String)> = BTreeMap::new();
    let mut unknown = Vec::new();
    for s in &scripts {
        for line in &s.lines {
            let (key, class) = class_of(line);
            let name = match class {
                KeyClass::Mapped(_) => "mapped",
                KeyClass::Ignored(_) => "ignored",
                KeyClass::Refused(_) => "refused",
                KeyClass::Unknown => {
                    unknown.push(format!("{}: {line}", s.path));
                    continue;
                }
            };
            // A key counts as mapped if any script's use of it maps, else as refused if any
            // script's value is refused, else as ignored.
            let rank = |n: &str| {
                ["ignored", "refused", "mapped"]
                    .iter()
                    .position(|x| *x == n)
            };
            let e = keys.entry(key).or_insert((name, line.clone()));
            if rank(name) > rank(e.0) {
                *e = (name, line.clone());
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "verl keys temper neither maps, ignores nor refuses:\n{}",
        unknown.join("\n")
    );
    let count = |c: &str| keys.values().filter(|(n, _)| *n == c).count();
    let (mapped, ignored, refused) = (count("mapped"), count("ignored"), count("refused"));
    println!(
        "{} keys: {mapped} mapped, {ignored} ignored, {refused} refused",
        keys.len()
    );
    let docs = docs();
    let counts = format!(
        "{} distinct keys: {mapped} mapped, {ignored} ignored, {refused} refused",
        keys.len()
    );
    assert!(
        docs.contains(&counts),
        "docs/training.md should say `{counts}`"
    );
    // Every entry of the two tables, with its reason, is a row of the docs' verl table.
    let rows: Vec<&str> = docs.lines().filter(|l| l.starts_with("| `")).collect();
    let shown = |entry: &str| {
        let name = match entry.strip_suffix('.') {
            Some(prefix) => format!("`{prefix}.*`"),
            None => format!("`{entry}`"),
        };
        format!("| {name} |")
    };
    let values = REFUSED_VALUES.iter().map(|r| (r.shown, r.reason));
    for (entry, reason) in IGNORED
        .iter()
        .copied()
        .chain(REFUSED.iter().map(|(e, _, r)| (*e, *r)))
        .chain(values)
    {
        let head = shown(entry);
        let row = rows
            .iter()
            .find(|r| r.starts_with(&head))
            .unwrap_or_else(|| panic!("docs/training.md has no row {head}"));
        assert!(
            row.contains(reason),
            "docs/training.md's row {head} should give the reason: {reason}"
        );
    }
}

#[test]
fn each_verl_script_loads_or_names_the_key_temper_refuses() {
    let (mut loaded, mut refused, mut wrong) = (0, 0, Vec::new());
    for s in scripts() {
        let refusals: Vec<String> = s
            .lines
            .iter()
            .filter(|l| matches!(class_of(l).1, KeyClass::Refused(_)))
            .cloned()
            .collect();
        match load_config_str(BASE, &s.path, &s.lines) {
            Ok(_) => {
                if !refusals.is_empty() {
                    wrong.push(format!("{}: loaded though it sets {refusals:?}", s.path));
                }
                loaded += 1;
            }
            Err(e) => {
                let msg = format!("{e:#}");
                let names_refusal = refusals
                    .iter()
                    .any(|l| msg.contains(&format!("override `{l}`")))
                    && msg.contains("cannot apply in temper");
                if !names_refusal {
                    wrong.push(format!("{}: {msg}", s.path));
                }
                refused += 1;
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    println!("{loaded} scripts load, {refused} are refused");
    assert!(loaded >= 30, "{loaded} scripts load");
}
