//! CPU pinning of spawned workers (a stage's `cpus`): worker i runs on core `cpus[i]` only, no
//! core is pinned twice (config), and the proxy keeps its own threads and the workers it spawns
//! unpinned off every pinned core ([`keep_off`]), so that a pinned worker shares its core with
//! nothing Corral starts (other processes on the machine are the deployment's to keep away).
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

    /// A mask of `cpus`.
    fn cpu_set(cpus: impl IntoIterator<Item = usize>) -> libc::cpu_set_t {
        // SAFETY: a plain bitmask, all zeroes is the empty set; `CPU_SET` bounds-checks.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for cpu in cpus {
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        set
    }

    /// Restricts thread `tid` (0: the calling one) to `set`. One system call, nothing else, so
    /// it may run in a forked child before exec.
    fn set_affinity(tid: libc::pid_t, set: &libc::cpu_set_t) -> io::Result<()> {
        // SAFETY: the kernel only reads `set`, of the size passed.
        if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Restricts every thread of this process to `cpus`; threads started afterwards inherit the
    /// mask from the thread that starts them. Every thread, not only the calling one: the
    /// allocator's background threads are running before `main`. The calling thread goes first,
    /// so that whatever it starts later is restricted even if another thread cannot be; then the
    /// others, over again until a pass finds no thread it has not restricted (one may have been
    /// started meanwhile by a thread not yet restricted). Returns the first error, having tried
    /// every thread.
    pub fn restrict(cpus: &BTreeSet<usize>) -> io::Result<()> {
        let set = cpu_set(cpus.iter().copied());
        set_affinity(0, &set)?;
        let mut done = BTreeSet::new();
        let mut first_error = None;
        loop {
            let tids: Vec<libc::pid_t> = std::fs::read_dir("/proc/self/task")?
                .filter_map(|task| task.ok()?.file_name().to_str()?.parse().ok())
                .filter(|tid| done.insert(*tid))
                .collect();
            if tids.is_empty() {
                return first_error.map_or(Ok(()), Err);
            }
            for tid in tids {
                match set_affinity(tid, &set) {
                    // ESRCH: the thread ended meanwhile, which is no failure.
                    Err(e) if e.raw_os_error() != Some(libc::ESRCH) => {
                        first_error.get_or_insert(e);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Makes the spawned process run on `cpu` only, from its first instruction: the mask is set
    /// in the child between fork and exec, so every thread it ever starts inherits it.
    pub fn pin(command: &mut tokio::process::Command, cpu: usize) {
        let set = cpu_set([cpu]);
        // SAFETY: the closure runs in the forked child before exec. It touches only its own
        // copy of the mask and makes one system call, which is async-signal-safe, as pre_exec
        // requires.
        unsafe {
            command.pre_exec(move || set_affinity(0, &set));
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

/// The cores the proxy keeps once it leaves the `pinned` ones to their workers: the cores it may
/// run on less those, or None when it keeps them all (nothing pinned) or would be left none (every
/// core it has is pinned: then it shares them, as it must run somewhere).
pub fn proxy_cores(allowed: &BTreeSet<usize>, pinned: &BTreeSet<usize>) -> Option<BTreeSet<usize>> {
    if pinned.is_empty() {
        return None;
    }
    let kept: BTreeSet<usize> = allowed.difference(pinned).copied().collect();
    (!kept.is_empty()).then_some(kept)
}

/// Keeps the proxy off the cores its workers are pinned to: on Linux, every thread of the process
/// is restricted to [`proxy_cores`]. Called before the runtime starts, so that each thread it
/// starts inherits the mask (the runtime sizes its pool to it), and so do the
/// workers it spawns unpinned: a pinned core is its worker's alone. The cores kept, or None when
/// nothing changed.
#[cfg(target_os = "linux")]
pub fn keep_off(pinned: &BTreeSet<usize>) -> std::io::Result<Option<BTreeSet<usize>>> {
    let Some(kept) = proxy_cores(&linux::allowed_cpus()?, pinned) else {
        return Ok(None);
    };
    linux::restrict(&kept)?;
    Ok(Some(kept))
}

#[cfg(not(target_os = "linux"))]
pub fn keep_off(_pinned: &BTreeSet<usize>) -> std::io::Result<Option<BTreeSet<usize>>> {
    Ok(None) // a config with cpus is refused here: nothing is pinned
}

#[cfg(target_os = "linux")]
pub use linux::pin;

#[cfg(not(target_os = "linux"))]
pub fn pin(_command: &mut tokio::process::Command, _cpu: usize) {
    unreachable!("a config with cpus is refused before anything is spawned")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::proxy_cores;

    fn cores(list: &[usize]) -> BTreeSet<usize> {
        list.iter().copied().collect()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_may_run_somewhere() {
        assert!(!super::allowed_cpus().unwrap().is_empty());
    }

    #[test]
    fn the_proxy_keeps_the_cores_no_worker_is_pinned_to() {
        assert_eq!(proxy_cores(&cores(&[0, 1, 2, 3]), &cores(&[3])), Some(cores(&[0, 1, 2])));
        assert_eq!(proxy_cores(&cores(&[0, 1, 2, 3]), &cores(&[1, 3])), Some(cores(&[0, 2])));
    }

    #[test]
    fn the_proxy_keeps_every_core_when_nothing_is_pinned() {
        assert_eq!(proxy_cores(&cores(&[0, 1]), &cores(&[])), None);
    }

    #[test]
    fn the_proxy_shares_the_cores_when_every_one_is_pinned() {
        assert_eq!(proxy_cores(&cores(&[0, 1]), &cores(&[0, 1])), None);
    }
}
