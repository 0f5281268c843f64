//! Device names as settings and flags spell them.

/// `cpu`, `cuda` (device 0) or `cuda:N` as the device of `setting` (named in errors); CUDA must
/// be present with that many devices. The one parser of every device setting and flag.
pub fn parse_device_for(setting: &str, s: &str) -> anyhow::Result<tch::Device> {
    let index = match s {
        "cpu" => return Ok(tch::Device::Cpu),
        "cuda" => 0,
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => i,
            _ => anyhow::bail!("{setting} = {s:?}: expected cpu, cuda or cuda:N"),
        },
    };
    let n = tch::Cuda::device_count().max(0) as usize;
    if index < n {
        return Ok(tch::Device::Cuda(index));
    }
    // Say what is missing: the CUDA build, the driver or GPUs, or this many GPUs.
    if !temper_kernels::cuda_build() {
        anyhow::bail!(
            "{setting} = {s:?}: this temper is built against a CPU-only libtorch (build it with \
             TEMPER_CUDA=1 scripts/setup-env.sh; docs/scaling.md)"
        );
    }
    if n == 0 {
        anyhow::bail!(
            "{setting} = {s:?}: no CUDA device is visible (no NVIDIA driver, or \
             CUDA_VISIBLE_DEVICES hides them)"
        );
    }
    anyhow::bail!("{setting} = {s:?}: only {n} CUDA device(s) are visible")
}
