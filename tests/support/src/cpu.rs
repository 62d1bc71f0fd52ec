//! CPU placement for benchmark processes: the load generator and the process under test each
//! get their own core, so one does not steal the other's time.
#![allow(unsafe_code)] // see the SAFETY lines

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Make the process `cmd` starts run on CPU `cpu` only (set between fork and exec, so the
/// program and every thread it starts inherit it). Spawning fails if the CPU does not exist.
pub fn pin_to_cpu(cmd: &mut Command, cpu: usize) -> &mut Command {
    // SAFETY: the hook runs in the forked child before exec; it only fills a stack value and
    // makes one syscall, both async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_runs_on_the_given_cpu_only() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "grep Cpus_allowed_list /proc/self/status"]);
        let out = pin_to_cpu(&mut cmd, 0).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.split_whitespace().nth(1), Some("0"), "{text}");
    }
}
