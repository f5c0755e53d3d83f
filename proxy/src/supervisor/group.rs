//! Each spawned worker runs in a process group of its own, and that group is what Corral kills.
//!
//! The command Corral spawns is often not the worker itself: `sh -c`, `uv run`, `poetry run` or
//! `conda run` start it as a child, and the pid a worker announces in `hello` is then not the pid
//! Corral spawned. The group (whose id is the spawned pid) holds the wrapper, the worker and
//! anything they start, so killing the group kills all of them, and a connection is matched to
//! its spawned command by the group of its peer's pid as the kernel tells it (not the pid its
//! hello announces). A process that leaves the group
//! on purpose (`setsid`, a daemon) is out of reach, as it means to be.
//!
//! Every live group is also listed process-wide, so that a proxy exiting in a hurry (a second
//! signal) can kill them all first; and the spawned process gets a parent-death signal, for a
//! proxy that is killed before it can do anything.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Groups of spawned workers that may still have members, by group id.
static LIVE: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Makes the command start in a new process group of its own (its id is the child's pid) and,
/// on Linux, die when the proxy does.
pub fn configure(command: &mut tokio::process::Command) {
    command.process_group(0);
    #[cfg(target_os = "linux")]
    die_with_parent(command);
}

/// Asks the kernel to SIGKILL the spawned process when the thread that spawned it exits (see
/// [`super::spawner`] for why that thread lives as long as the proxy).
///
/// SIGKILL rather than SIGTERM: once the proxy is gone the worker has nothing left to finish
/// (its connection and its clients went with the proxy), and SIGKILL is the one signal a worker
/// cannot catch, ignore or defer while stuck in native code, so the guarantee does not depend on
/// what the worker does. It reaches only the process Corral spawned; a worker started through a
/// wrapper is covered by `CORRAL_PROXY_PID` (the worker exits when that process is gone).
///
/// The same step gives the worker back the soft open-file limit the proxy started with, if the
/// proxy raised its own (`open_files`): a worker is not a server of ten thousand connections.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut tokio::process::Command) {
    let parent = std::process::id() as libc::pid_t;
    let soft = crate::open_files::soft_limit_before();
    // SAFETY: the closure runs in the forked child before exec; prctl, getppid, getrlimit and
    // setrlimit are async-signal-safe system calls and the closure touches nothing but its
    // captured values.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The proxy may have died between fork and prctl: then no signal will ever come.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the proxy exited while starting a worker"));
            }
            if let Some(soft) = soft {
                let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                    limit.rlim_cur = soft.min(limit.rlim_max);
                    libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                }
            }
            Ok(())
        });
    }
}

/// Notes a new group (the spawned pid) as live.
pub fn register(group: u32) {
    lock().insert(group);
}

/// Kills whatever is left of the group and forgets it. Called once its leader (the spawned
/// process) has exited, so that nothing the worker started outlives it: a worker left behind by
/// its wrapper would be a second copy beside the restarted one. The kernel does not hand out a
/// group's id as a pid while the group has members; once it has none, the id could only be
/// taken in the moment between reaping the leader and this call, by a process that then made
/// a group of its own.
pub fn finish(group: u32) {
    signal(group, libc::SIGKILL);
    lock().remove(&group);
}

/// Sends `signal` to every process in the group; false if the group has no members left.
pub fn signal(group: u32, signal: libc::c_int) -> bool {
    let Ok(group) = libc::pid_t::try_from(group) else {
        return false;
    };
    if group <= 1 {
        return false; // never the whole session, never init
    }
    // SAFETY: a plain system call on integers.
    unsafe { libc::killpg(group, signal) == 0 }
}

/// The process group of `pid`, if that process exists.
pub fn of(pid: u32) -> Option<u32> {
    let pid = libc::pid_t::try_from(pid).ok().filter(|&pid| pid > 0)?;
    // SAFETY: a plain system call on an integer.
    let group = unsafe { libc::getpgid(pid) };
    u32::try_from(group).ok().filter(|&group| group > 0)
}

/// SIGKILLs every live group: for an exit that cannot wait for the supervisor to stop them.
pub fn kill_all() {
    for &group in lock().iter() {
        signal(group, libc::SIGKILL);
    }
}

fn lock() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_group_is_found_and_a_missing_process_has_none() {
        // SAFETY: a plain system call.
        let ours = unsafe { libc::getpgrp() } as u32;
        assert_eq!(of(std::process::id()), Some(ours));
        assert_eq!(of(0), None);
        assert_eq!(of(u32::MAX), None);
    }

    #[test]
    fn init_and_the_callers_session_are_never_signalled() {
        assert!(!signal(0, 0));
        assert!(!signal(1, 0));
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn killing_the_group_kills_what_the_spawned_shell_started() {
        let mut command = tokio::process::Command::new("sh");
        // sh stays the parent (no exec), as with `uv run` or `poetry run`: the sleep is its child.
        command.args(["-c", "sleep 600 & echo $!; wait"]).stdout(std::process::Stdio::piped());
        configure(&mut command);
        let mut shell = command.spawn().unwrap();
        let group = shell.id().unwrap();
        let mut out = tokio::io::BufReader::new(shell.stdout.take().unwrap());
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await.unwrap();
        let sleeper: u32 = line.trim().parse().unwrap();
        assert_eq!(of(sleeper), Some(group), "the grandchild is in the spawned group");

        register(group);
        assert!(signal(group, libc::SIGKILL));
        shell.wait().await.unwrap();
        finish(group);
        // The sleeper is sh's child, not ours; sh is reaped, so once killed it goes to init and
        // is reaped there. Until then it may linger as a zombie: ask for its state, bounded.
        let gone = (0..500).any(|_| {
            let state = std::fs::read_to_string(format!("/proc/{sleeper}/stat"));
            let dead = state.map_or(true, |s| s.contains(") Z "));
            if !dead {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            dead
        });
        assert!(gone, "the shell's child survived the group kill");
        assert!(!lock().contains(&group));
    }
}
