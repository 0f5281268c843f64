//! Checkpoints appear whole or not at all; retention keeps the newest.
use temper_testkit as common;
use temper_train::checkpoint::{
    latest, list_checkpoints, prune, remove_partial, save_checkpoint, TrainerState,
};

fn write_model(dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("model.safetensors"), b"weights")?;
    Ok(())
}

#[test]
fn a_failed_save_leaves_no_checkpoint_behind() {
    let dir = common::temp_dir("ckpt");
    let state = |step| TrainerState {
        step,
        batches_drawn: step,
        kl_coef: None,
        policy_version: 0,
    };
    save_checkpoint(&dir, &state(1), &write_model, &|p| {
        Ok(std::fs::write(p.join("optimizer.safetensors"), b"opt")?)
    })
    .unwrap();
    // The optimizer write fails half-way through step 2's checkpoint.
    let e = save_checkpoint(&dir, &state(2), &write_model, &|_| {
        anyhow::bail!("disk full")
    })
    .unwrap_err();
    assert!(format!("{e:#}").contains("disk full") && format!("{e:#}").contains("global_step_2"));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into())
        .collect();
    assert_eq!(
        names,
        vec!["global_step_1".to_string()],
        "no partial folder may remain"
    );
    assert_eq!(latest(&dir).unwrap().0, 1);
    // A crash mid-write (a leftover .tmp) is ignored by resume and cleaned up.
    std::fs::create_dir_all(dir.join("global_step_3.tmp/model")).unwrap();
    assert_eq!(latest(&dir).unwrap().0, 1);
    remove_partial(&dir).unwrap();
    assert!(!dir.join("global_step_3.tmp").exists());
    for s in 2..=4 {
        save_checkpoint(&dir, &state(s), &write_model, &|p| {
            Ok(std::fs::write(p.join("optimizer.safetensors"), b"opt")?)
        })
        .unwrap();
    }
    prune(&dir, Some(2)).unwrap();
    let steps: Vec<usize> = list_checkpoints(&dir)
        .unwrap()
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(steps, vec![3, 4]);
    assert_eq!(
        temper_train::checkpoint::read_state(&dir.join("global_step_4")).unwrap(),
        state(4)
    );
    let e = latest(&common::temp_dir("none")).unwrap_err();
    assert!(e.to_string().contains("no complete checkpoint"));
}
