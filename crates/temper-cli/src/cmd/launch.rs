//! `temper train --nproc N`: start N ranks of the same command on this machine, the way
//! `torchrun --standalone --nproc-per-node N` does (RANK, LOCAL_RANK, WORLD_SIZE,
//! LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and wait for them. When one fails the others are
//! stopped, so a dead rank never leaves the rest waiting.
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{bail, Context, Result};

pub use temper_base::net::free_port;

pub fn spawn_local_ranks(nproc: usize, command_line: &[String]) -> Result<()> {
    let exe = std::env::current_exe().context("finding the temper binary")?;
    let args = without_nproc(&command_line[1..]);
    let port = free_port()?;
    // Split the cores between the ranks unless the user chose (as torchrun sets OMP_NUM_THREADS).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / nproc).max(1).to_string();
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..nproc {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", nproc.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        if std::env::var_os("OMP_NUM_THREADS").is_none() {
            cmd.env("OMP_NUM_THREADS", &threads);
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                stop(&mut children);
                bail!("starting rank {rank}: {e}");
            }
        }
    }
    let mut done = vec![false; nproc];
    loop {
        for (rank, child) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            if let Some(status) = child.try_wait()? {
                done[rank] = true;
                if !status.success() {
                    stop(&mut children);
                    bail!("rank {rank} of {nproc} failed ({status}); the other ranks were stopped");
                }
            }
        }
        if done.iter().all(|d| *d) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The arguments without `--nproc N` / `--nproc=N` (each rank is one process).
fn without_nproc(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
        } else if a == "--nproc" {
            skip = true;
        } else if !a.starts_with("--nproc=") {
            out.push(a.clone());
        }
    }
    out
}

fn stop(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nproc_is_removed_from_the_ranks_arguments() {
        let a: Vec<String> = ["train", "--nproc", "2", "c.toml", "--nproc=3", "x=1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(super::without_nproc(&a), ["train", "c.toml", "x=1"]);
    }
}
