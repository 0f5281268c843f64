//! The dtype a run computes in. `model.dtype = "auto"` is decided when the run starts, on a CPU
//! with a bf16 dot product by a short measurement ([`resolve_compute_kind`]) that a quiet and a
//! busy machine could answer differently. So the choice is recorded (`compute_dtype` in
//! `run_metadata.json`) and a resumed run keeps it, as exact resume needs; and under data
//! parallel every rank takes rank 0's, since the ranks must compute alike.

use crate::dist::Dist;
use anyhow::{Context, Result};
use std::path::Path;
use tch::Device;
use temper_model::{resolve_compute_kind, ComputeKind, DtypeRequest};

/// The compute dtype a run recorded when it started (`None` for a run folder without one).
pub(super) fn recorded_compute(metadata: &Path) -> Result<Option<ComputeKind>> {
    let Ok(text) = std::fs::read_to_string(metadata) else {
        return Ok(None);
    };
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", metadata.display()))?;
    match json.get("compute_dtype") {
        None => Ok(None),
        Some(v) => {
            let s = v.as_str().with_context(|| {
                format!(
                    "{}: field compute_dtype: expected a string",
                    metadata.display()
                )
            })?;
            s.parse()
                .map(Some)
                .with_context(|| format!("{}: field compute_dtype", metadata.display()))
        }
    }
}

/// What `dtype` (the config's `model.dtype`) computes in for this run on `device`. `recorded` is
/// the resumed run's choice, kept when the config still says `auto`.
pub(super) fn run_compute(
    dtype: DtypeRequest,
    device: Device,
    dist: &Dist,
    recorded: Option<ComputeKind>,
) -> Result<ComputeKind> {
    let root = dist.is_root();
    if let (Some(kind), DtypeRequest::Auto) = (recorded, dtype) {
        if root {
            eprintln!(
                "temper: resuming in {kind}, which model.dtype = \"auto\" chose when the run started"
            );
        }
        return Ok(kind);
    }
    let choice = resolve_compute_kind(dtype, device)?;
    if root {
        if let Some(note) = &choice.note {
            eprintln!("temper: {note}");
        }
        if let Some(w) = &choice.warning {
            eprintln!("warning: {w}");
        }
    }
    let chosen: ComputeKind = dist.from_root(choice.compute.to_string())?.parse()?;
    if chosen != choice.compute {
        eprintln!(
            "temper: rank {} computes in rank 0's {chosen} (model.dtype = \"{dtype}\" measured {} here)",
            dist.rank, choice.compute
        );
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_records_its_compute_dtype_and_a_bad_record_names_the_field() {
        let dir = std::env::temp_dir().join(format!("temper-compute-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("run_metadata.json");
        assert_eq!(recorded_compute(&file).unwrap(), None);
        std::fs::write(&file, r#"{"seed": 1}"#).unwrap();
        assert_eq!(recorded_compute(&file).unwrap(), None);
        std::fs::write(&file, r#"{"compute_dtype": "bf16"}"#).unwrap();
        assert_eq!(recorded_compute(&file).unwrap(), Some(ComputeKind::Bf16));
        std::fs::write(&file, r#"{"compute_dtype": "f16"}"#).unwrap();
        let e = format!("{:#}", recorded_compute(&file).unwrap_err());
        assert!(e.contains("run_metadata.json: field compute_dtype"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_resumed_auto_run_keeps_its_dtype_and_an_explicit_one_wins() {
        let one = Dist::single();
        // The recorded choice is kept without measuring, whatever this CPU would pick now.
        for kind in [ComputeKind::Bf16, ComputeKind::F32] {
            assert_eq!(
                run_compute(DtypeRequest::Auto, Device::Cpu, &one, Some(kind)).unwrap(),
                kind
            );
        }
        let explicit = run_compute(
            DtypeRequest::Float32,
            Device::Cpu,
            &one,
            Some(ComputeKind::Bf16),
        );
        assert_eq!(explicit.unwrap(), ComputeKind::F32);
    }
}
