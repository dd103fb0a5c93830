//! What `/proc` says about the host and the tool: resident memory and CPU time.

use std::fs;

/// `VmRSS` of process `pid` in KiB, if it can be read.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// User plus system CPU time of `/proc/{who}` (a pid, or `self`) in seconds.
pub fn cpu_seconds(who: &str) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{who}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its ')' are fixed.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

fn clock_ticks() -> f64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if t > 0 {
            return t as f64;
        }
    }
    100.0
}

/// CPU time stolen by the hypervisor from the whole machine, in seconds (`steal` in
/// `/proc/stat`, summed over CPUs).
pub fn steal_seconds() -> Option<f64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let steal: f64 = cpu.split_whitespace().nth(7)?.parse().ok()?;
    Some(steal / clock_ticks())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        assert!(rss_kib(std::process::id()).is_some_and(|k| k > 0));
        assert!(cpu_seconds("self").is_some());
        if cfg!(target_os = "linux") {
            assert!(steal_seconds().is_some());
        }
    }
}
