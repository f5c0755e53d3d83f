//! Where each spawned worker runs and what it is told: its GPU and its environment.
//!
//! A stage's workers are spread over its devices (`--gpus`, per stage `gpus`) in blocks of
//! `workers_per_gpu`: with devices `[0, 1]` and two per device, workers 0 and 1 get device 0,
//! workers 2 and 3 device 1. A worker sees exactly its device (`CUDA_VISIBLE_DEVICES`) and is
//! told which it is (`CORRAL_GPU`). Placement is by the worker's index, which a restarted worker
//! keeps, so it gets the same device back (its memory was freed with the process; the device's
//! other worker is untouched). `--gpus all` asks the machine (`nvidia-smi -L`, else the entries
//! of `/proc/driver/nvidia/gpus`).
//!
//! Environment values (`--worker-env NAME=VALUE`, per stage `env`) may say `{index}` and `{gpu}`;
//! `{{` and `}}` are literal braces. Anything else in braces is a config error, found at start.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

/// The device of worker `index`, if the stage has devices.
pub fn gpu_of(gpus: &[u32], per_gpu: u32, index: u32) -> Option<u32> {
    gpus.get((index / per_gpu.max(1)) as usize).copied()
}

/// What is wrong with an environment value ([`check`]).
#[derive(Debug, PartialEq)]
pub enum BadValue {
    /// A NUL byte: the worker could never be started (its spawn would fail on every restart).
    Nul,
    /// `{gpu}` in a value for a stage whose workers get no device: the caller says which stage
    /// and what to do, which depends on where the value came from.
    NoGpu,
    /// A placeholder Corral does not fill in (its text).
    Unknown(String),
}

impl std::fmt::Display for BadValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadValue::Nul => f.write_str("holds a NUL byte, which no environment variable can"),
            BadValue::NoGpu => f.write_str("{gpu} is used but the stage has no gpus"),
            BadValue::Unknown(placeholder) => write!(
                f,
                "unknown placeholder {placeholder:?}: values may use {{index}} and {{gpu}} \
                 ({{{{ and }}}} for literal braces)"
            ),
        }
    }
}

/// Checks an environment value's placeholders (`{index}`, `{gpu}`, `{{`, `}}`); the problem if
/// any. `{gpu}` needs devices.
pub fn check(value: &str, has_gpus: bool) -> Result<(), BadValue> {
    if value.contains('\0') {
        return Err(BadValue::Nul);
    }
    expand(value, 0, has_gpus.then_some(0)).map(|_| ())
}

/// The value with its placeholders filled in for worker `index` on device `gpu`.
pub fn expand(value: &str, index: u32, gpu: Option<u32>) -> Result<String, BadValue> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find(['{', '}']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push('}');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{index}") {
            out.push_str(&index.to_string());
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{gpu}") {
            let gpu = gpu.ok_or(BadValue::NoGpu)?;
            out.push_str(&gpu.to_string());
            rest = after;
        } else {
            let end = tail.find('}').map_or(tail.len(), |i| i + 1);
            return Err(BadValue::Unknown(tail[..end].to_string()));
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Splits `NAME=VALUE`; the problem if it is not that.
pub fn pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if valid_name(name) => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not NAME=VALUE (NAME: letters, digits and _)")),
    }
}

/// An environment variable name a shell would take.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Longest `nvidia-smi -L` may take: a wedged driver hangs it, and the pod must fail loudly
/// rather than sit there without a word.
const ASK_LIMIT: Duration = Duration::from_secs(10);

/// The machine's GPUs, for `--gpus all`: `nvidia-smi -L`, else `/proc/driver/nvidia/gpus`; the
/// reason when none is found. Asked once a process, whatever stages say `all`, so that every
/// stage sees the same devices and a slow `nvidia-smi` is waited for once.
pub fn discover() -> Result<Vec<u32>, String> {
    static FOUND: OnceLock<Result<Vec<u32>, String>> = OnceLock::new();
    FOUND.get_or_init(ask_the_machine).clone()
}

fn ask_the_machine() -> Result<Vec<u32>, String> {
    let smi = match nvidia_smi() {
        Ok(out) if out.status.success() => {
            let mut listed: Vec<u32> = Vec::new();
            let indices = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|line| line.strip_prefix("GPU ")?.split(':').next()?.parse().ok())
                .collect::<Vec<u32>>();
            for index in indices {
                // A device listed twice would get twice the workers meant for one.
                if !listed.contains(&index) {
                    listed.push(index);
                }
            }
            if !listed.is_empty() {
                return Ok(listed);
            }
            "nvidia-smi -L listed no GPU".to_string()
        }
        Ok(out) => {
            // Its reason from stdout, where nvidia-smi writes its own ("No devices were found",
            // "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
            // else stderr: read from stderr alone it was dropped, or a warning said instead.
            // A terminal's colours and other control characters are left out of the error.
            let first = |bytes: &[u8]| {
                let text = String::from_utf8_lossy(bytes);
                text.lines()
                    .map(plain)
                    .map(|line| line.trim().to_string())
                    .find(|line| !line.is_empty())
            };
            let said = first(&out.stdout).or_else(|| first(&out.stderr)).unwrap_or_default();
            format!(
                "nvidia-smi -L failed ({}){}",
                out.status,
                if said.is_empty() { String::new() } else { format!(": {said}") }
            )
        }
        Err(e) => format!("nvidia-smi: {e}"),
    };
    let proc_dir = Path::new("/proc/driver/nvidia/gpus");
    let entries = std::fs::read_dir(proc_dir).map(|dir| dir.count()).unwrap_or(0);
    if entries > 0 {
        return Ok((0..entries as u32).collect());
    }
    Err(format!("`all` found no GPU: {smi}, and {} has no entries", proc_dir.display()))
}

/// `line` without its ANSI escape sequences (ESC `[`, parameters, a final byte from `@` to `~`)
/// and other control characters.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' && chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, up to and with the final byte.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else if !c.is_control() {
            out.push(c);
        }
    }
    out
}

/// `nvidia-smi -L`'s output, waited for up to [`ASK_LIMIT`]; past it the command is killed.
fn nvidia_smi() -> std::io::Result<Output> {
    let child = Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let (done, output) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    output.recv_timeout(ASK_LIMIT).unwrap_or_else(|_| {
        // SAFETY: kill(2) on the child's pid, which is not reaped until its waiting thread
        // sees it die, so the pid cannot have been reused.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        let limit = ASK_LIMIT.as_secs();
        Err(std::io::Error::other(format!("no answer to -L within {limit} s (killed)")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_fill_each_device_in_turn() {
        let gpus = [3, 5];
        let placed: Vec<_> = (0..4).map(|i| gpu_of(&gpus, 2, i)).collect();
        assert_eq!(placed, [Some(3), Some(3), Some(5), Some(5)]);
        assert_eq!(gpu_of(&[], 1, 0), None);
    }

    #[test]
    fn placeholders_fill_in_and_braces_escape() {
        assert_eq!(expand("/models/{gpu}/w{index}", 2, Some(1)).unwrap(), "/models/1/w2");
        assert_eq!(expand("{{index}} {index}", 7, None).unwrap(), "{index} 7");
        assert_eq!(expand("plain", 0, None).unwrap(), "plain");
    }

    #[test]
    fn an_unknown_placeholder_or_a_gpu_without_devices_is_refused() {
        assert!(check("{rank}", true).unwrap_err().to_string().contains("\"{rank}\""));
        assert_eq!(check("{gpu}", false), Err(BadValue::NoGpu));
        assert_eq!(check("a\0b", true), Err(BadValue::Nul));
        assert!(check("{unclosed", true).is_err());
        assert!(check("a}b", true).is_err());
        assert!(check("{gpu}-{index}", true).is_ok());
    }

    #[test]
    fn a_line_is_told_without_its_colours() {
        assert_eq!(plain("\x1b[31mNo devices were found\x1b[0m\x07"), "No devices were found");
        assert_eq!(plain("GPU 0: A [1]"), "GPU 0: A [1]", "brackets alone are text");
    }

    #[test]
    fn pairs_need_a_name() {
        assert_eq!(pair("OMP_NUM_THREADS=4").unwrap(), ("OMP_NUM_THREADS".into(), "4".into()));
        assert_eq!(pair("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(pair("=4").is_err() && pair("NOEQUALS").is_err() && pair("1X=2").is_err());
    }
}
