//! Where a stage's spawned workers run and what they are given: the devices they are spread
//! over (`gpus`, `workers_per_gpu`), the cores they are pinned to (`cpus`), and their
//! environment (`worker_env`, the stage's `env`, `--worker-env`), resolved and checked against
//! the worker count before anything starts. What a worker is then given at spawn is
//! `supervisor::placement`'s.

use std::collections::{HashMap, HashSet};

use super::{error, Config, ConfigError, StageSpec};
use crate::config::MAX_WORKERS;
use crate::supervisor::placement;

/// The keys a placement error names.
pub(super) struct Keys {
    pub gpus: String,
    /// Where the stage's workers per device came from: its own key, the file's, or the flag.
    pub per_gpu: String,
    pub workers: String,
    pub cpus: String,
    pub env: String,
}

/// What names a `--worker-env` (or `CORRAL_WORKER_ENV`) value in an error, its name following:
/// the flag, with or without a file (the file holds no such key).
const GIVEN_ENV: &str = "--worker-env";

/// `count` of a thing in words, "1 core", "2 cores": errors had said "1 cores".
pub(super) fn amount(count: usize, thing: &str) -> String {
    format!("{count} {thing}{}", if count == 1 { "" } else { "s" })
}

/// Spreads a stage's spawned workers over its devices and sets their environment: the workers
/// default to devices × per device, a conflicting explicit count is an error naming both, and
/// every environment value's placeholders are checked now (the file's `env`, then
/// `--worker-env`, which wins for a name both set).
pub(super) fn place(
    spec: &mut StageSpec,
    gpus: Vec<u32>,
    per_gpu: u32,
    asked: Option<u32>,
    stage_env: Vec<(String, String)>,
    config: &Config,
    keys: &Keys,
) -> Result<(), ConfigError> {
    // The file's top-level `worker_env` first, then the stage's own `env`, then `--worker-env`:
    // a later one wins for a name both set.
    let mut env: Vec<(String, String)> = Vec::new();
    // Where each name's value came from, for its error: a --worker-env value had been blamed on
    // the file's stage `env`.
    let mut source: HashMap<String, String> = HashMap::new();
    for text in &config.file_worker_env {
        let (name, value) = placement::pair(text).map_err(|e| error("worker_env", e))?;
        not_corrals(&name).map_err(|problem| error("worker_env", problem))?;
        env.retain(|(other, _)| *other != name);
        source.insert(name.clone(), format!("worker_env.{name}"));
        env.push((name, value));
    }
    for (name, value) in stage_env {
        not_corrals(&name).map_err(|problem| error(format!("{}.{name}", keys.env), problem))?;
        env.retain(|(other, _)| *other != name);
        source.insert(name.clone(), format!("{}.{name}", keys.env));
        env.push((name, value));
    }
    if !gpus.is_empty() {
        if spec.command.is_empty() {
            let problem = "only spawned workers can be given GPUs; add a worker command";
            return Err(error(&keys.gpus, problem));
        }
        let placed = gpus.len() as u32 * per_gpu;
        if let Some(asked) = asked.filter(|&asked| asked != placed) {
            // Each named where it came from, as the error's key is.
            let problem = format!(
                "{}, but {} {gpus:?} with {} {per_gpu} place {placed}; leave {} out, or make \
                 them agree",
                amount(asked as usize, "worker"),
                keys.gpus,
                keys.per_gpu,
                keys.workers
            );
            return Err(error(&keys.workers, problem));
        }
        if !spec.cpus.is_empty() && spec.cpus.len() != placed as usize {
            let problem = format!(
                "{} in {}, but {} {gpus:?} with {} {per_gpu} place {}: one worker per core",
                amount(spec.cpus.len(), "core"),
                keys.cpus,
                keys.gpus,
                keys.per_gpu,
                amount(placed as usize, "worker")
            );
            return Err(error(&keys.cpus, problem));
        }
        if placed > MAX_WORKERS {
            // Named by what placed them: the file may set no `workers` at all.
            let problem = format!(
                "{} with {} {per_gpu} place {placed} workers, more than {MAX_WORKERS}",
                amount(gpus.len(), "device"),
                keys.per_gpu
            );
            return Err(error(&keys.gpus, problem));
        }
        spec.workers = placed;
    }
    for name in env.iter().map(|(name, _)| name) {
        if !placement::valid_name(name) {
            let problem = "an environment variable name is letters, digits and _";
            return Err(error(format!("{}.{name}", keys.env), problem));
        }
    }
    for text in &config.worker_env {
        let (name, value) = placement::pair(text).map_err(|e| error(GIVEN_ENV, e))?;
        not_corrals(&name).map_err(|problem| error(GIVEN_ENV, problem))?;
        env.retain(|(other, _)| *other != name);
        source.insert(name.clone(), format!("{GIVEN_ENV} {name}"));
        env.push((name, value));
    }
    // Only where workers are spawned: a stage whose workers start elsewhere uses none of it
    // (and a value every stage gets, `{gpu}` in it, had been refused there with advice that
    // could not be followed: such a stage may not be given `gpus`).
    let spawns = !spec.command.is_empty();
    for (name, value) in env.iter().filter(|_| spawns) {
        placement::check(value, !gpus.is_empty()).map_err(|problem| {
            let said = match problem {
                placement::BadValue::NoGpu => {
                    no_gpu(&spec.name, &source[name], keys, config.config.is_none())
                }
                other => other.to_string(),
            };
            error(&source[name], said)
        })?;
    }
    spec.gpus = gpus;
    spec.workers_per_gpu = per_gpu;
    spec.env = env;
    Ok(())
}

/// Why `{gpu}` cannot be filled in for `stage`, and what to do, by where the value came from
/// (`source`): a value every stage gets had left a two-stage file's user to guess which stage
/// had no device.
fn no_gpu(stage: &str, source: &str, keys: &Keys, flags_alone: bool) -> String {
    if flags_alone {
        // One stage, and the flag is what gives it devices.
        "{gpu} is used but no --gpus is set".to_string()
    } else if source.starts_with(&keys.env) {
        format!("{{gpu}} is used but stage {stage:?} has no gpus: give the stage `gpus`")
    } else {
        format!(
            "{{gpu}} is used but stage {stage:?} has no gpus, and every stage gets this value: \
             give the stage `gpus`, or, where only some stages have them, give the value in \
             their own `env`"
        )
    }
}

/// What Corral tells each worker it spawns, which the worker's environment may not set: its
/// socket, its stage, its index and the proxy's pid. Set, a worker said hello for the wrong
/// stage (`CORRAL_STAGE=a` in a two-stage file moved stage b's worker to a: b never got one,
/// and every request waited for its 408), or lost its proxy. (`CUDA_VISIBLE_DEVICES` stays the
/// user's to set: a MIG device is named so.)
const CORRALS: [&str; 4] =
    ["CORRAL_SOCKET", "CORRAL_STAGE", "CORRAL_WORKER_INDEX", "CORRAL_PROXY_PID"];

fn not_corrals(name: &str) -> Result<(), String> {
    match CORRALS.contains(&name) {
        true => Err(format!(
            "{name} is Corral's to set for each worker it spawns (with CORRAL_SOCKET, \
             CORRAL_STAGE, CORRAL_WORKER_INDEX and CORRAL_PROXY_PID): leave it out"
        )),
        false => Ok(()),
    }
}

/// `--gpus`/`gpus`: `all` (the machine's) or a list of device indexes, each once.
pub(super) fn resolve_gpus(key: &str, text: &str) -> Result<Vec<u32>, ConfigError> {
    if text.trim().eq_ignore_ascii_case("all") {
        return placement::discover().map_err(|problem| error(key, problem));
    }
    if text.split(',').all(|part| part.trim().is_empty()) {
        // A stage under a top-level `gpus` (or --gpus) cannot opt out with an empty list: the
        // devices belong on the stages that use them.
        let problem = "an empty list; leave the key out for no GPUs (a stage under a top-level \
                       gpus or --gpus takes those: set gpus on the stages that use GPUs instead)";
        return Err(error(key, problem));
    }
    let mut gpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            // `0,,1` or `0,1,` is more likely a device left out than a comma too many.
            return Err(error(key, format!("{text:?} has an empty entry (gpus: a list like 0,1)")));
        }
        let gpu: u32 = part.parse().map_err(|_| {
            error(key, format!("{part:?} is not a device index (gpus: `all` or a list like 0,1)"))
        })?;
        if gpus.contains(&gpu) {
            return Err(error(key, format!("device {gpu} is listed twice")));
        }
        gpus.push(gpu);
    }
    Ok(gpus)
}

/// The workers of a stage pinned to `cpus`: one per core, so an explicit count (`asked`) must
/// agree; the error names both keys.
pub(super) fn pinned_workers(
    cpus: &[usize],
    asked: Option<u32>,
    cpus_key: &str,
    workers_key: &str,
) -> Result<u32, ConfigError> {
    let pinned = cpus.len();
    match asked {
        Some(workers) if workers as usize != pinned => {
            let problem = format!(
                "{} but {} in {cpus_key}: one worker per core; leave {workers_key} out, or \
                 make them agree",
                amount(workers as usize, "worker"),
                amount(pinned, "core")
            );
            Err(error(workers_key, problem))
        }
        _ => Ok(pinned as u32),
    }
}

/// One worker per core across stages too: a pinned core is its worker's alone (the proxy keeps
/// off it as well, see `supervisor::affinity`).
pub(super) fn check_cores_shared(stages: &[StageSpec]) -> Result<(), ConfigError> {
    let mut owners: HashMap<usize, &str> = HashMap::new();
    for stage in stages {
        for &cpu in &stage.cpus {
            if let Some(owner) = owners.insert(cpu, &stage.name) {
                let problem = format!(
                    "core {cpu} is pinned by stages.{owner}.cpus as well: one worker per core"
                );
                return Err(error(format!("stages.{}.cpus", stage.name), problem));
            }
        }
    }
    Ok(())
}

pub(super) fn check_cpus(key: &str, cpus: &[usize]) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for &cpu in cpus {
        if !seen.insert(cpu) {
            return Err(error(key, format!("core {cpu} is listed twice: one worker per core")));
        }
    }
    let allowed = crate::supervisor::affinity::allowed_cpus()
        .map_err(|e| error(key, format!("cannot pin workers here: {e}")))?;
    if let Some(cpu) = cpus.iter().find(|cpu| !allowed.contains(cpu)) {
        let problem = format!("core {cpu} is not available to this process (cores: {allowed:?})");
        return Err(error(key, problem));
    }
    Ok(())
}
