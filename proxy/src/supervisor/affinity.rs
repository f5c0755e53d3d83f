//! CPU pinning of spawned workers (a stage's `cpus`): worker i runs on core `cpus[i]` only, so
//! that workers of a CPU-bound stage do not fight over cores with each other or with the proxy.
//! Linux only (`sched_setaffinity`); elsewhere a config that asks for it is refused.

use std::collections::BTreeSet;

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::BTreeSet;
    use std::io;

    /// The cores this process may run on.
    pub fn allowed_cpus() -> io::Result<BTreeSet<usize>> {
        // SAFETY: `set` is a plain bitmask owned by this frame; the kernel writes at most its
        // size, which is what we pass.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Err(io::Error::last_os_error());
            }
            let limit = libc::CPU_SETSIZE as usize;
            Ok((0..limit).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect())
        }
    }

    /// Makes the spawned process run on `cpu` only, from its first instruction: the mask is set
    /// in the child between fork and exec, so every thread it ever starts inherits it.
    pub fn pin(command: &mut tokio::process::Command, cpu: usize) {
        // SAFETY: the closure runs in the forked child before exec. It touches only its own
        // stack and makes one system call, which is async-signal-safe, as pre_exec requires.
        unsafe {
            command.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// The cores this process may run on (a config's `cpus` must be among them).
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> std::io::Result<BTreeSet<usize>> {
    linux::allowed_cpus()
}

#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> std::io::Result<BTreeSet<usize>> {
    Err(std::io::Error::other("CPU pinning needs Linux"))
}

#[cfg(target_os = "linux")]
pub use linux::pin;

#[cfg(not(target_os = "linux"))]
pub fn pin(_command: &mut tokio::process::Command, _cpu: usize) {
    unreachable!("a config with cpus is refused before anything is spawned")
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn this_process_may_run_somewhere() {
        assert!(!super::allowed_cpus().unwrap().is_empty());
    }
}
