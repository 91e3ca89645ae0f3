//! Child processes: killed and reaped on drop, signalled, waited for, and their memory.

use crate::eventually;
use anyhow::{Result, bail};
use std::time::Duration;

/// A child process that is killed (SIGKILL) and reaped when dropped, so that a test failing early
/// (an `eventually` timing out between kills) leaves no worker running against the broker.
#[derive(Debug)]
pub struct Reaped(pub std::process::Child);

impl std::ops::Deref for Reaped {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Sends `signal` to a child process.
pub fn signal(child: &std::process::Child, signal: i32) -> Result<()> {
    let rc = kill(child.id() as i32, signal);
    if rc != 0 {
        bail!("kill({}, {signal}) failed: {}", child.id(), std::io::Error::last_os_error());
    }
    Ok(())
}

#[allow(unsafe_code)]
fn kill(pid: i32, sig: i32) -> i32 {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) }
}

/// Waits for a child to exit, up to `timeout`; returns its status.
pub async fn wait_exit(child: &mut std::process::Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    eventually("the child to exit", timeout, || Ok(child.try_wait()?)).await
}

/// A memory field of `/proc/<pid>/status` (`/proc/self/status` for `None`) in KiB, e.g. `VmHWM`
/// (peak resident set size) or `VmRSS`. `None` if the process or the field does not exist (a
/// zombie has no `Vm` fields; not Linux).
pub fn proc_status_kib(pid: Option<u32>, field: &str) -> Option<u64> {
    let path = pid.map_or_else(|| "/proc/self/status".to_owned(), |pid| format!("/proc/{pid}/status"));
    let status = std::fs::read_to_string(path).ok()?;
    status.lines().find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))?.split_whitespace().next()?.parse().ok()
}

/// Resident and peak resident memory of a process, in KiB, from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    Some((proc_status_kib(Some(pid), "VmRSS")?, proc_status_kib(Some(pid), "VmHWM")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_resident_memory_of_a_process() {
        let (rss, hwm) = rss_kib(std::process::id()).expect("/proc/<pid>/status on Linux");
        assert!(rss > 0 && hwm >= rss, "rss {rss} hwm {hwm}");
        assert!(rss_kib(u32::MAX).is_none());
        assert!(proc_status_kib(None, "NoSuchField").is_none());
    }
}
