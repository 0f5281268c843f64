//! Finding a TCP port to listen on.

use anyhow::{Context, Result};

/// A TCP port free on `host` now (for a rendezvous store or a child server). Another process may
/// take it before the caller binds it; callers bind it at once.
pub fn free_port_on(host: &str) -> Result<u16> {
    Ok(std::net::TcpListener::bind((host, 0))
        .and_then(|l| l.local_addr())
        .with_context(|| format!("finding a free port on {host}"))?
        .port())
}

/// [`free_port_on`] the loopback interface.
pub fn free_port() -> Result<u16> {
    free_port_on("127.0.0.1")
}
