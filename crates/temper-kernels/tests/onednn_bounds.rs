//! The oneDNN cache bounds: set where the user has not set them, kept where they have, and taken
//! out of the environment of a peer process temper starts (only those temper set).
use std::ffi::OsStr;

#[test]
fn bounds_fill_only_unset_variables_and_stay_out_of_peers() {
    std::env::set_var("LRU_CACHE_CAPACITY", "7");
    std::env::remove_var("ONEDNN_PRIMITIVE_CACHE_CAPACITY");
    temper_kernels::memory::bound_onednn_caches();
    assert_eq!(std::env::var("LRU_CACHE_CAPACITY").unwrap(), "7");
    assert_eq!(
        std::env::var("ONEDNN_PRIMITIVE_CACHE_CAPACITY").unwrap(),
        "128"
    );

    let mut cmd = std::process::Command::new("env");
    temper_kernels::memory::without_temper_onednn_bounds(&mut cmd);
    let removed: Vec<&OsStr> = cmd
        .get_envs()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k)
        .collect();
    assert_eq!(removed, [OsStr::new("ONEDNN_PRIMITIVE_CACHE_CAPACITY")]);
    let out = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
    assert!(
        out.contains("LRU_CACHE_CAPACITY=7"),
        "the user's own value reaches the peer"
    );
    assert!(!out.contains("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), "{out}");
}
