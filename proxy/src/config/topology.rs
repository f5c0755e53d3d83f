//! What the proxy serves: its stages (batching, workers) and its routes (an HTTP path and the
//! stages its jobs go through), resolved from the command line, the environment and the config
//! file, and checked before anything starts.
//!
//! Precedence, for every option: a flag or `CORRAL_*` variable that was set, then the stage's own
//! key in the file, then the file's top-level key, then the built-in default. Without a file the
//! proxy serves one stage, `default`, on one route, `POST /infer`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use super::file::{self, File, StageFile};
use super::{check_ratio, check_share, parse_header_name, parse_mode, Config};
use super::{MAX_BATCH_SIZE, MAX_WORKERS};
use crate::metrics::UNKNOWN_STAGE;
use crate::stage::Policy;
use crate::supervisor::placement;
use crate::traffic::Class;

/// The name of the single stage (and pipeline) of a proxy configured without a file.
pub const DEFAULT_STAGE: &str = "default";
/// The route a proxy serves when nothing else is configured.
pub const DEFAULT_PATH: &str = "/infer";
/// Paths Corral answers itself; no route may take them.
pub const RESERVED_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics", "/openapi.json"];
/// Where the client protocols live ([`crate::http::protocols`]); no route path may start so
/// (nor be `/v2`, Open Inference Protocol v2's server metadata).
pub const PROTOCOL_PREFIXES: &[&str] = &["/v1/", "/v2/"];
/// The model name of the default route, as clients of the model-serving protocols call it.
pub const DEFAULT_MODEL: &str = "default";

/// A client protocol a route may speak besides Corral's own envelope (KServe v1 needs no
/// declaration: every route speaks it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OpenAI's `POST /v1/embeddings`.
    OpenAiEmbeddings,
}

impl Protocol {
    const ALL: &[(&str, Protocol)] = &[("openai-embeddings", Protocol::OpenAiEmbeddings)];

    fn parse(name: &str) -> Result<Protocol, String> {
        let found = Self::ALL.iter().find(|(known, _)| *known == name).map(|(_, p)| *p);
        found.ok_or_else(|| {
            let known: Vec<&str> = Self::ALL.iter().map(|(known, _)| *known).collect();
            format!("{name:?} is not a protocol Corral speaks (protocols: {})", known.join(", "))
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub stages: Vec<StageSpec>,
    pub routes: Vec<RouteSpec>,
}

/// One stage as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct StageSpec {
    pub name: String,
    pub max_batch_size: u32,
    /// Most payload bytes in one batch (a larger job goes alone).
    pub max_batch_bytes: u64,
    pub max_wait: Duration,
    pub batch_policy: Policy,
    pub worker_prefetch: bool,
    /// Longest a worker may hold a batch (None: the batch's latest deadline plus a margin).
    pub batch_timeout: Option<Duration>,
    pub queue_capacity: u32,
    /// Payload bytes the queue holds (an empty queue takes any one request).
    pub queue_capacity_bytes: u64,
    /// Longest a streamed answer from this stage may last.
    pub stream_timeout: Duration,
    /// Most total weight in one batch (None: unbounded).
    pub max_batch_weight: Option<u64>,
    /// Worker command to spawn (empty: external workers connect on their own).
    pub command: Vec<String>,
    pub workers: u32,
    /// Cores to pin spawned workers to, worker i on `cpus[i]` (empty: no pinning).
    pub cpus: Vec<usize>,
    /// GPUs the spawned workers are spread over, `workers_per_gpu` each (empty: none).
    pub gpus: Vec<u32>,
    pub workers_per_gpu: u32,
    /// Environment for the spawned workers (values may hold `{index}` and `{gpu}`).
    pub env: Vec<(String, String)>,
}

/// One route as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteSpec {
    /// The config key naming the route (`infer` for the default route): the operation's name in
    /// `/openapi.json`.
    pub name: String,
    /// What the model-serving protocols call it: the route's name, `default` for the default
    /// route.
    pub model: String,
    pub path: String,
    pub pipeline: String,
    /// Stage names, in the order a job goes through them.
    pub stages: Vec<String>,
    pub timeout: Duration,
    pub protocol: Option<Protocol>,
    /// The class of requests that send no `x-corral-priority`.
    pub priority: Class,
}

/// A config error: which key, and what is wrong with it.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct ConfigError {
    pub key: String,
    pub problem: String,
}

fn error(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError { key: key.into(), problem: problem.into() }
}

/// Reads `--config` if given and resolves the topology; `explicit(id)` tells whether option `id`
/// (a `Config` field name) was set on the command line or in the environment. Top-level file
/// options land in `config`, so that the rest of the proxy reads one place.
pub fn load(config: &mut Config, explicit: &dyn Fn(&str) -> bool) -> Result<Topology, String> {
    let Some(path) = config.config.clone() else {
        return single_placed(config, explicit).map_err(|e| e.to_string());
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read the config file {}: {e}", path.display()))?;
    let shown = path.display();
    let file = file::parse(&text).map_err(|e| format!("config file {shown}: {e}"))?;
    resolve(config, file, explicit).map_err(|e| format!("config file {shown}: {e}"))
}

/// The topology of a proxy configured by flags alone, its workers placed.
fn single_placed(
    config: &Config,
    explicit: &dyn Fn(&str) -> bool,
) -> Result<Topology, ConfigError> {
    // Clap checks each flag alone; this one is bounded by another (--max-batch-size).
    batch_bytes("max_batch_bytes", config.max_batch_bytes, config.max_batch_size)?;
    let mut topology = single(config);
    let spec = &mut topology.stages[0];
    let gpus = match &config.gpus {
        Some(text) => resolve_gpus("gpus", text)?,
        None => Vec::new(),
    };
    let asked = explicit("workers").then_some(config.workers);
    if !config.cpus.is_empty() {
        spec.workers = pinned_workers(&config.cpus, asked, "cpus", "workers")?;
        if spec.command.is_empty() {
            let problem = "only spawned workers can be pinned; add a worker command after `--`";
            return Err(error("cpus", problem));
        }
        check_cpus("cpus", &config.cpus)?;
        spec.cpus = config.cpus.clone();
    }
    let keys = Keys {
        gpus: "gpus".into(),
        workers: "workers".into(),
        cpus: "cpus".into(),
        env: "worker_env".into(),
    };
    place(spec, gpus, config.workers_per_gpu, asked, Vec::new(), config, &keys)?;
    Ok(topology)
}

/// The topology of a proxy configured by flags alone.
pub fn single(config: &Config) -> Topology {
    Topology {
        stages: vec![StageSpec {
            name: DEFAULT_STAGE.into(),
            max_batch_size: config.max_batch_size,
            max_batch_bytes: config.max_batch_bytes,
            max_wait: config.max_wait(),
            batch_policy: config.batch_policy,
            worker_prefetch: config.worker_prefetch,
            batch_timeout: config.batch_timeout(),
            queue_capacity: config.queue_capacity,
            queue_capacity_bytes: config.queue_capacity_bytes,
            stream_timeout: Duration::from_millis(config.stream_timeout_ms),
            max_batch_weight: config.max_batch_weight,
            command: config.worker_cmd.clone(),
            workers: config.workers,
            cpus: Vec::new(),
            gpus: Vec::new(),
            workers_per_gpu: config.workers_per_gpu,
            env: Vec::new(),
        }],
        routes: vec![RouteSpec {
            name: "infer".into(),
            model: DEFAULT_MODEL.into(),
            path: DEFAULT_PATH.into(),
            pipeline: DEFAULT_STAGE.into(),
            stages: vec![DEFAULT_STAGE.into()],
            timeout: config.timeout(),
            protocol: None,
            priority: Class::Normal,
        }],
    }
}

/// Sets `config.$field` from the file's top level unless the option was set explicitly.
macro_rules! top_level {
    ($config:ident, $file:ident, $explicit:ident, $($field:ident),+) => {
        $(if let Some(value) = $file.$field.take() {
            if !$explicit(stringify!($field)) {
                $config.$field = value;
            }
        })+
    };
}

pub fn resolve(
    config: &mut Config,
    mut file: File,
    explicit: &dyn Fn(&str) -> bool,
) -> Result<Topology, ConfigError> {
    if let Some(mode) = file.socket_mode.take() {
        let mode = parse_mode(&mode).map_err(|problem| error("socket_mode", problem))?;
        if !explicit("socket_mode") {
            config.socket_mode = mode;
        }
    }
    let f = &mut file;
    top_level!(config, f, explicit, listen, socket, log_format, retries, timeout_ms);
    top_level!(config, f, explicit, max_body_bytes, max_connections, header_read_timeout_ms);
    top_level!(config, f, explicit, body_read_timeout_ms, idle_timeout_ms, max_header_bytes);
    top_level!(config, f, explicit, max_headers, queue_capacity_bytes, stream_timeout_ms);
    top_level!(config, f, explicit, stream_buffer_bytes, priority_aging_ms, tenant_queue_share);
    if let Some(name) = f.max_batch_weight.take() {
        if !explicit("max_batch_weight") {
            config.max_batch_weight = Some(name);
        }
    }
    if let Some(name) = f.tenant_header.take() {
        let name = parse_header_name(&name).map_err(|problem| error("tenant_header", problem))?;
        if !explicit("tenant_header") {
            config.tenant_header = name;
        }
    }
    top_level!(config, f, explicit, grace_period_ms, max_batch_size, max_wait_ms, batch_policy);
    top_level!(config, f, explicit, max_batch_bytes, shared_memory_bytes);
    top_level!(config, f, explicit, worker_prefetch, batch_timeout_ms, queue_capacity, workers);
    top_level!(config, f, explicit, workers_per_gpu);
    if let Some(url) = f.otlp_endpoint.take() {
        if !explicit("otlp_endpoint") {
            config.otlp_endpoint = Some(url);
        }
    }
    if let Some(ratio) = f.trace_sample_ratio.take() {
        check_ratio(ratio).map_err(|problem| error("trace_sample_ratio", problem))?;
        if !explicit("trace_sample_ratio") {
            config.trace_sample_ratio = ratio;
        }
    }
    if let Some(pairs) = f.worker_env.take() {
        // Defaults under each stage's own `env` and `--worker-env` (`place`), not in their place.
        config.file_worker_env = pairs;
    }
    if let Some(gpus) = f.gpus.take() {
        if !explicit("gpus") {
            config.gpus = Some(gpus.text());
        }
    }
    check_options(config)?;

    if file.stages.is_empty() {
        return Err(error("stages", "the file declares no stage; add a [stages.NAME] table"));
    }
    let command_line_command = !config.worker_cmd.is_empty();
    if command_line_command && file.stages.len() > 1 {
        return Err(error(
            "stages",
            "a worker command after `--` needs a file with exactly one stage; with several, \
             give each stage its own `command`",
        ));
    }
    if explicit("cpus") && file.stages.len() > 1 {
        // One list for several stages would put their workers on the same cores.
        return Err(error(
            "cpus",
            "--cpus pins the workers of a file's only stage; with several stages, give each \
             stage its own `cpus`",
        ));
    }
    let mut stages = Vec::new();
    for (name, stage) in std::mem::take(&mut file.stages) {
        stages.push(stage_spec(config, &name, stage, explicit)?);
    }
    check_cores_shared(&stages)?;
    let known: HashSet<&str> = stages.iter().map(|s| s.name.as_str()).collect();

    let mut pipelines: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, pipeline) in &file.pipelines {
        let key = format!("pipelines.{name}.stages");
        if pipeline.stages.is_empty() {
            return Err(error(key, "a pipeline needs at least one stage"));
        }
        for (i, stage) in pipeline.stages.iter().enumerate() {
            if !known.contains(stage.as_str()) {
                let problem = format!("no stage named {stage:?} (stages: {})", list(&known));
                return Err(error(format!("{key}[{i}]"), problem));
            }
        }
        pipelines.insert(name.clone(), pipeline.stages.clone());
    }
    // One stage and no pipeline: that stage is the pipeline, under its own name.
    if pipelines.is_empty() && stages.len() == 1 {
        pipelines.insert(stages[0].name.clone(), vec![stages[0].name.clone()]);
    }

    let routes = if file.routes.is_empty() {
        default_route(config, &pipelines)?
    } else {
        let mut routes = Vec::new();
        let mut paths = HashSet::new();
        for (name, route) in &file.routes {
            let key = format!("routes.{name}");
            let path = route.path.clone().unwrap_or_else(|| format!("/{name}"));
            check_path(&format!("{key}.path"), &path)?;
            if !paths.insert(path.clone()) {
                return Err(error(format!("{key}.path"), format!("{path} is served twice")));
            }
            let Some(pipeline) = pipelines.get(&route.pipeline) else {
                let names: HashSet<&str> = pipelines.keys().map(String::as_str).collect();
                let problem =
                    format!("no pipeline named {:?} (pipelines: {})", route.pipeline, list(&names));
                return Err(error(format!("{key}.pipeline"), problem));
            };
            let timeout_ms = match route.timeout_ms {
                Some(ms) if !explicit("timeout_ms") => ms,
                _ => config.timeout_ms,
            };
            positive(&format!("{key}.timeout_ms"), timeout_ms)?;
            let protocol = match &route.protocol {
                None => None,
                Some(name) => {
                    Some(Protocol::parse(name).map_err(|e| error(format!("{key}.protocol"), e))?)
                }
            };
            // One path, one route: the protocol's path cannot say which of two routes it means.
            if let Some(other) =
                routes.iter().find(|r: &&RouteSpec| r.protocol.is_some() && r.protocol == protocol)
            {
                let problem = format!("routes.{} speaks this protocol already", other.name);
                return Err(error(format!("{key}.protocol"), problem));
            }
            routes.push(RouteSpec {
                name: name.clone(),
                model: name.clone(),
                path,
                pipeline: route.pipeline.clone(),
                stages: pipeline.clone(),
                timeout: Duration::from_millis(timeout_ms),
                protocol,
                priority: route.priority.unwrap_or_default(),
            });
        }
        routes
    };
    // A stage no route reaches would take workers and never a job: surely a mistake.
    let used: HashSet<&str> =
        routes.iter().flat_map(|r| r.stages.iter().map(String::as_str)).collect();
    if let Some(idle) = stages.iter().find(|s| !used.contains(s.name.as_str())) {
        return Err(error(format!("stages.{}", idle.name), "no route's pipeline uses this stage"));
    }
    Ok(Topology { stages, routes })
}

/// Without `[routes]`: `POST /infer` serves the file's only pipeline.
fn default_route(
    config: &Config,
    pipelines: &BTreeMap<String, Vec<String>>,
) -> Result<Vec<RouteSpec>, ConfigError> {
    let mut only = pipelines.iter();
    match (only.next(), only.next()) {
        (Some((name, stages)), None) => Ok(vec![RouteSpec {
            name: "infer".into(),
            model: DEFAULT_MODEL.into(),
            path: DEFAULT_PATH.into(),
            pipeline: name.clone(),
            stages: stages.clone(),
            timeout: config.timeout(),
            protocol: None,
            priority: Class::Normal,
        }]),
        (None, _) => Err(error(
            "pipelines",
            "with several stages, declare a [pipelines.NAME] table with `stages = [...]`",
        )),
        (Some(_), Some(_)) => Err(error(
            "routes",
            "with several pipelines, declare [routes.NAME] tables saying which path serves which",
        )),
    }
}

fn stage_spec(
    config: &Config,
    name: &str,
    stage: StageFile,
    explicit: &dyn Fn(&str) -> bool,
) -> Result<StageSpec, ConfigError> {
    let key = |field: &str| format!("stages.{name}.{field}");
    let valid_name = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !valid_name {
        let problem = "a stage name is letters, digits, `_`, `-` and `.`";
        return Err(error(format!("stages.{name:?}"), problem));
    }
    if name == UNKNOWN_STAGE {
        // Workers refused for naming no stage are counted under it.
        let problem = "`unknown` is the stage label of refused workers' metrics; pick another";
        return Err(error(format!("stages.{name}"), problem));
    }
    // A flag or variable that was set wins over the stage's own key.
    macro_rules! pick {
        ($field:ident) => {
            match stage.$field {
                Some(value) if !explicit(stringify!($field)) => value,
                _ => config.$field,
            }
        };
    }
    let max_batch_size = pick!(max_batch_size);
    in_range(&key("max_batch_size"), max_batch_size.into(), 1, MAX_BATCH_SIZE.into())?;
    let max_batch_bytes = pick!(max_batch_bytes);
    // Checked per stage, against the stage's own max_batch_size; named where the value came from.
    let from_stage = stage.max_batch_bytes.is_some() && !explicit("max_batch_bytes");
    let source = if from_stage { key("max_batch_bytes") } else { "max_batch_bytes".into() };
    batch_bytes(&source, max_batch_bytes, max_batch_size)?;
    let queue_capacity = pick!(queue_capacity);
    positive(&key("queue_capacity"), queue_capacity.into())?;
    let queue_capacity_bytes = pick!(queue_capacity_bytes);
    positive(&key("queue_capacity_bytes"), queue_capacity_bytes)?;
    let batch_timeout_ms = pick!(batch_timeout_ms);
    let stream_timeout_ms = pick!(stream_timeout_ms);
    positive(&key("stream_timeout_ms"), stream_timeout_ms)?;
    let max_batch_weight = match stage.max_batch_weight {
        Some(weight) if !explicit("max_batch_weight") => Some(weight),
        _ => config.max_batch_weight,
    };
    if let Some(weight) = max_batch_weight {
        positive(&key("max_batch_weight"), weight)?;
    }

    let command = match stage.command {
        _ if !config.worker_cmd.is_empty() => config.worker_cmd.clone(),
        Some(command) if command.is_empty() => {
            return Err(error(
                key("command"),
                "an empty command; leave the key out for workers started elsewhere",
            ));
        }
        Some(command) => command,
        None => Vec::new(),
    };
    // A set --cpus wins over the stage's own key, as every flag wins over the file.
    let (cpus, cpus_key) = if explicit("cpus") {
        (config.cpus.clone(), "cpus".to_string())
    } else {
        (stage.cpus.unwrap_or_default(), key("cpus"))
    };
    let workers = match (stage.workers, cpus.len()) {
        (_, pinned) if pinned > 0 && explicit("workers") => {
            pinned_workers(&cpus, Some(config.workers), &cpus_key, "workers")?
        }
        (Some(workers), pinned) if pinned > 0 => {
            pinned_workers(&cpus, Some(workers), &cpus_key, &key("workers"))?
        }
        _ if explicit("workers") => config.workers,
        (Some(workers), _) => workers,
        (None, 0) => config.workers,
        (None, pinned) => pinned as u32,
    };
    in_range(&key("workers"), workers.into(), 1, MAX_WORKERS.into())?;
    let asked = if explicit("workers") { Some(config.workers) } else { stage.workers };
    let gpus = match (&stage.gpus, &config.gpus) {
        (_, Some(text)) if explicit("gpus") => resolve_gpus("gpus", text)?,
        (Some(gpus), _) => resolve_gpus(&key("gpus"), &gpus.text())?,
        (None, Some(text)) => resolve_gpus("gpus", text)?,
        (None, None) => Vec::new(),
    };
    let per_gpu = match stage.workers_per_gpu {
        Some(per) if !explicit("workers_per_gpu") => per,
        _ => config.workers_per_gpu,
    };
    in_range(&key("workers_per_gpu"), per_gpu.into(), 1, MAX_WORKERS.into())?;
    let env: Vec<(String, String)> = stage.env.unwrap_or_default().into_iter().collect();
    if !cpus.is_empty() {
        if command.is_empty() {
            return Err(error(cpus_key, "only spawned workers can be pinned; add `command`"));
        }
        check_cpus(&cpus_key, &cpus)?;
    }
    let mut spec = StageSpec {
        name: name.to_string(),
        max_batch_size,
        max_batch_bytes,
        max_wait: Duration::from_millis(pick!(max_wait_ms)),
        batch_policy: pick!(batch_policy),
        worker_prefetch: pick!(worker_prefetch),
        batch_timeout: (batch_timeout_ms > 0).then(|| Duration::from_millis(batch_timeout_ms)),
        queue_capacity,
        queue_capacity_bytes,
        stream_timeout: Duration::from_millis(stream_timeout_ms),
        max_batch_weight,
        command,
        workers,
        cpus,
        gpus: Vec::new(),
        workers_per_gpu: per_gpu,
        env: Vec::new(),
    };
    let keys = Keys { gpus: key("gpus"), workers: key("workers"), cpus: cpus_key, env: key("env") };
    place(&mut spec, gpus, per_gpu, asked, env, config, &keys)?;
    Ok(spec)
}

/// The keys a placement error names.
struct Keys {
    gpus: String,
    workers: String,
    cpus: String,
    env: String,
}

/// Spreads a stage's spawned workers over its devices and sets their environment: the workers
/// default to devices × per device, a conflicting explicit count is an error naming both, and
/// every environment value's placeholders are checked now (the file's `env`, then
/// `--worker-env`, which wins for a name both set).
fn place(
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
    for text in &config.file_worker_env {
        let (name, value) = placement::pair(text).map_err(|e| error("worker_env", e))?;
        env.retain(|(other, _)| *other != name);
        env.push((name, value));
    }
    for (name, value) in stage_env {
        env.retain(|(other, _)| *other != name);
        env.push((name, value));
    }
    if !gpus.is_empty() {
        if spec.command.is_empty() {
            let problem = "only spawned workers can be given GPUs; add a worker command";
            return Err(error(&keys.gpus, problem));
        }
        let placed = gpus.len() as u32 * per_gpu;
        if let Some(asked) = asked.filter(|&asked| asked != placed) {
            let problem = format!(
                "{asked} workers, but gpus {gpus:?} with workers_per_gpu {per_gpu} place \
                 {placed}; leave workers out, or make them agree"
            );
            return Err(error(&keys.workers, problem));
        }
        if !spec.cpus.is_empty() && spec.cpus.len() != placed as usize {
            let problem = format!(
                "{} cores in {}, but gpus {gpus:?} with workers_per_gpu {per_gpu} place \
                 {placed} workers: one worker per core",
                spec.cpus.len(),
                keys.cpus
            );
            return Err(error(&keys.cpus, problem));
        }
        in_range(&keys.workers, placed.into(), 1, MAX_WORKERS.into())?;
        spec.workers = placed;
    }
    for name in env.iter().map(|(name, _)| name) {
        if !placement::valid_name(name) {
            let problem = "an environment variable name is letters, digits and _";
            return Err(error(format!("{}.{name}", keys.env), problem));
        }
    }
    for text in &config.worker_env {
        let (name, value) = placement::pair(text).map_err(|e| error("worker_env", e))?;
        env.retain(|(other, _)| *other != name);
        env.push((name, value));
    }
    for (name, value) in &env {
        placement::check(value, !gpus.is_empty())
            .map_err(|problem| error(format!("{}.{name}", keys.env), problem))?;
    }
    spec.gpus = gpus;
    spec.workers_per_gpu = per_gpu;
    spec.env = env;
    Ok(())
}

/// `--gpus`/`gpus`: `all` (the machine's) or a list of device indexes, each once.
fn resolve_gpus(key: &str, text: &str) -> Result<Vec<u32>, ConfigError> {
    if text.trim().eq_ignore_ascii_case("all") {
        return placement::discover().map_err(|problem| error(key, problem));
    }
    let mut gpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|part| !part.is_empty()) {
        let gpu: u32 = part.parse().map_err(|_| {
            error(key, format!("{part:?} is not a device index (gpus: `all` or a list like 0,1)"))
        })?;
        if gpus.contains(&gpu) {
            return Err(error(key, format!("device {gpu} is listed twice")));
        }
        gpus.push(gpu);
    }
    if gpus.is_empty() {
        return Err(error(key, "an empty list; leave the key out for no GPUs"));
    }
    Ok(gpus)
}

/// The ranges clap enforces on flags, enforced on the file's top-level values too.
fn check_options(config: &Config) -> Result<(), ConfigError> {
    in_range("max_batch_size", config.max_batch_size.into(), 1, MAX_BATCH_SIZE.into())?;
    in_range("workers", config.workers.into(), 1, MAX_WORKERS.into())?;
    positive("timeout_ms", config.timeout_ms)?;
    positive("queue_capacity", config.queue_capacity.into())?;
    positive("queue_capacity_bytes", config.queue_capacity_bytes)?;
    positive("max_connections", config.max_connections.into())?;
    positive("header_read_timeout_ms", config.header_read_timeout_ms)?;
    positive("body_read_timeout_ms", config.body_read_timeout_ms)?;
    positive("idle_timeout_ms", config.idle_timeout_ms)?;
    positive("stream_timeout_ms", config.stream_timeout_ms)?;
    positive("stream_buffer_bytes", config.stream_buffer_bytes)?;
    positive("priority_aging_ms", config.priority_aging_ms)?;
    if let Some(weight) = config.max_batch_weight {
        positive("max_batch_weight", weight)?;
    }
    check_share(config.tenant_queue_share)
        .map_err(|problem| error("tenant_queue_share", problem))?;
    Ok(())
}

fn check_path(key: &str, path: &str) -> Result<(), ConfigError> {
    if !path.starts_with('/') || path.len() < 2 {
        return Err(error(key, format!("{path:?} is not a path such as \"/embed\"")));
    }
    if path.contains(['?', '#', ' ']) {
        return Err(error(key, format!("{path:?}: a route path has no query, fragment or space")));
    }
    if RESERVED_PATHS.contains(&path) {
        return Err(error(key, format!("{path} is Corral's own route")));
    }
    if let Some(prefix) = PROTOCOL_PREFIXES.iter().find(|p| path.starts_with(*p) || path == "/v2") {
        let problem = format!("{path}: paths under {prefix} are the client protocols'");
        return Err(error(key, problem));
    }
    Ok(())
}

/// The workers of a stage pinned to `cpus`: one per core, so an explicit count (`asked`) must
/// agree; the error names both keys.
fn pinned_workers(
    cpus: &[usize],
    asked: Option<u32>,
    cpus_key: &str,
    workers_key: &str,
) -> Result<u32, ConfigError> {
    let pinned = cpus.len();
    match asked {
        Some(workers) if workers as usize != pinned => {
            let problem = format!(
                "{workers} workers but {pinned} cores in {cpus_key}: one worker per core; \
                 leave {workers_key} out, or make them agree"
            );
            Err(error(workers_key, problem))
        }
        _ => Ok(pinned as u32),
    }
}

/// One worker per core across stages too: a pinned core is its worker's alone (the proxy keeps
/// off it as well, see `supervisor::affinity`).
fn check_cores_shared(stages: &[StageSpec]) -> Result<(), ConfigError> {
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

fn check_cpus(key: &str, cpus: &[usize]) -> Result<(), ConfigError> {
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

fn in_range(key: &str, value: u64, low: u64, high: u64) -> Result<(), ConfigError> {
    if (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(error(key, format!("{value} is not in {low}..={high}")))
    }
}

/// A batch byte budget that a full batch's frame can carry.
fn batch_bytes(key: &str, value: u64, max_batch_size: u32) -> Result<(), ConfigError> {
    let most = crate::frame_payload_bytes(max_batch_size as usize) as u64;
    if (1..=most).contains(&value) {
        return Ok(());
    }
    let problem = format!(
        "{value} is not in 1..={most} (what a frame of {max_batch_size} jobs carries under the \
         worker protocol's 64 MiB frame limit)"
    );
    Err(error(key, problem))
}

fn positive(key: &str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(error(key, "must be at least 1"));
    }
    Ok(())
}

fn list(names: &HashSet<&str>) -> String {
    let mut names: Vec<&str> = names.iter().copied().collect();
    names.sort_unstable();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn resolve_with(text: &str, flags: &[&str], set: &[&str]) -> Result<Topology, ConfigError> {
        let mut config = Config::parse_from([&["corral"], flags].concat());
        let explicit = |id: &str| set.contains(&id);
        resolve(&mut config, file::parse(text).unwrap(), &explicit)
    }

    const TWO_STAGES: &str = r#"
        max_batch_size = 4
        max_wait_ms = 3
        [stages.decode]
        command = ["python", "decode.py"]
        workers = 2
        [stages.model]
        max_batch_size = 16
        [pipelines.p]
        stages = ["decode", "model"]
    "#;

    #[test]
    fn an_address_to_listen_on_is_taken_as_people_write_one() {
        let listen =
            |flag: &str| Config::try_parse_from(["corral", "--listen", flag]).map(|c| c.listen);
        assert_eq!(listen("127.0.0.1:8000").unwrap(), "127.0.0.1:8000".parse().unwrap());
        assert_eq!(listen("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert_eq!(listen(":8000").unwrap(), "0.0.0.0:8000".parse().unwrap());
        assert!(listen("localhost:8000").unwrap().ip().is_loopback());
        let refused = listen("8000").unwrap_err().to_string();
        assert!(refused.contains("HOST:PORT, or :PORT"), "{refused}");
        assert!(listen(":99999").is_err());
        let mut config = Config::parse_from(["corral"]);
        let file = "listen = \":0\"\n[stages.s]\n[pipelines.p]\nstages = [\"s\"]";
        resolve(&mut config, file::parse(file).unwrap(), &|_: &str| false).unwrap();
        assert_eq!(config.listen, "0.0.0.0:0".parse().unwrap(), "the file's listen as the flag's");
        let error = file::parse("listen = \"nonsense\"").unwrap_err().to_string();
        assert!(error.contains("HOST:PORT"), "{error}");
    }

    #[test]
    fn the_file_that_help_shows_is_one_that_loads() {
        let help = include_str!("after_help.txt");
        let example: String = help
            .lines()
            .skip_while(|line| !line.starts_with("  listen ="))
            .take_while(|line| line.is_empty() || line.starts_with("  "))
            .map(|line| format!("{}\n", line.get(2..).unwrap_or("")))
            .collect();
        let topology = resolve_with(&example, &[], &[]).unwrap();
        assert_eq!(topology.routes.len(), 2);
        for stage in &topology.stages {
            let script =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(&stage.command[1]);
            assert!(script.exists(), "{} is in the repository", stage.command[1]);
        }
    }

    #[test]
    fn without_a_file_one_default_stage_serves_infer() {
        let config = Config::parse_from(["corral", "--max-batch-size", "8", "--", "w"]);
        let topology = single(&config);
        assert_eq!(topology.stages.len(), 1);
        assert_eq!((topology.stages[0].max_batch_size, topology.stages[0].workers), (8, 1));
        assert_eq!(topology.routes[0].path, "/infer");
        assert_eq!(topology.routes[0].stages, ["default"]);
    }

    #[test]
    fn a_stage_key_beats_the_top_level_which_beats_the_default() {
        let topology = resolve_with(TWO_STAGES, &[], &[]).unwrap();
        let [decode, model] = &topology.stages[..] else { panic!("two stages") };
        assert_eq!((decode.max_batch_size, model.max_batch_size), (4, 16));
        assert_eq!(decode.max_wait, Duration::from_millis(3));
        assert_eq!((decode.workers, decode.command.len()), (2, 2));
        assert!(model.command.is_empty(), "no command: external workers");
        assert_eq!(decode.queue_capacity, 1024, "the built-in default");
        assert_eq!(decode.queue_capacity_bytes, 1 << 30, "the built-in default");
        let route = &topology.routes[0];
        assert_eq!(route.path, "/infer");
        assert_eq!(route.stages, ["decode", "model"]);
    }

    #[test]
    fn a_flag_that_was_set_beats_the_file() {
        let flags = ["--max-batch-size", "2", "--timeout-ms", "900"];
        let topology = resolve_with(TWO_STAGES, &flags, &["max_batch_size", "timeout_ms"]).unwrap();
        assert!(topology.stages.iter().all(|stage| stage.max_batch_size == 2));
        assert_eq!(topology.routes[0].timeout, Duration::from_millis(900));
    }

    #[test]
    fn every_option_the_file_sets_is_a_command_line_option() {
        // main.rs asks clap whether each of these was set; an id clap does not know would panic.
        let matches = <Config as clap::CommandFactory>::command().get_matches_from(["corral"]);
        let keys = [
            "listen",
            "socket",
            "socket_mode",
            "log_format",
            "retries",
            "timeout_ms",
            "max_body_bytes",
            "shared_memory_bytes",
            "max_connections",
            "header_read_timeout_ms",
            "body_read_timeout_ms",
            "idle_timeout_ms",
            "max_header_bytes",
            "max_headers",
            "grace_period_ms",
            "max_batch_size",
            "max_batch_bytes",
            "max_wait_ms",
            "batch_policy",
            "worker_prefetch",
            "batch_timeout_ms",
            "queue_capacity",
            "queue_capacity_bytes",
            "stream_timeout_ms",
            "stream_buffer_bytes",
            "workers",
        ];
        // `cpus` is asked about too, but it is a stage's key in the file, not a top-level one.
        for key in keys.iter().chain(&["cpus"]) {
            assert!(matches.try_contains_id(key).is_ok(), "{key}");
        }
        // And the file takes every one of them at its top level (a value of the wrong type is
        // refused as such, not as an unknown key).
        for key in keys {
            if let Err(refused) = file::parse(&format!("{key} = 0\n")) {
                assert!(!refused.contains("unknown field"), "{refused}");
            }
        }
    }

    #[test]
    fn cpus_set_the_worker_count() {
        let text = "[stages.a]\ncommand = [\"w\"]\ncpus = [0]\n";
        assert_eq!(resolve_with(text, &[], &[]).unwrap().stages[0].workers, 1);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn two_stages_may_not_pin_the_same_core() {
        let core = a_core();
        let text = format!(
            "[stages.a]\ncommand = [\"w\"]\ncpus = [{core}]\n\
             [stages.b]\ncommand = [\"w\"]\ncpus = [{core}]\n\
             [pipelines.p]\nstages = [\"a\", \"b\"]\n"
        );
        let error = resolve_with(&text, &[], &[]).unwrap_err().to_string();
        assert!(error.starts_with("stages.b.cpus:"), "{error}");
        assert!(
            error.contains(&format!("core {core} is pinned by stages.a.cpus as well")),
            "{error}"
        );
    }

    /// A core this process may run on (what `check_cpus` accepts here).
    fn a_core() -> String {
        let allowed = crate::supervisor::affinity::allowed_cpus().unwrap();
        allowed.first().unwrap().to_string()
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_cpus_flag_pins_the_command_lines_workers_and_sets_their_count() {
        let core = a_core();
        let config = Config::parse_from(["corral", "--cpus", &core, "--", "w"]);
        let topology = single_placed(&config, &|_| false).unwrap();
        let stage = &topology.stages[0];
        assert_eq!((stage.cpus.clone(), stage.workers), (vec![core.parse().unwrap()], 1));
        // With --gpus the placed workers must match the cores, one each.
        let config = Config::parse_from(["corral", "--cpus", &core, "--gpus", "0", "--", "w"]);
        let topology = single_placed(&config, &|_| false).unwrap();
        assert_eq!((topology.stages[0].workers, topology.stages[0].gpus.clone()), (1, vec![0]));
        let config = Config::parse_from(["corral", "--cpus", &core, "--gpus", "0,1", "--", "w"]);
        let error = single_placed(&config, &|_| false).unwrap_err();
        assert_eq!(error.key, "cpus");
        assert!(error.problem.contains("gpus [0, 1] with workers_per_gpu 1 place 2"), "{error}");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_cpus_flag_is_refused_against_workers_or_without_a_command() {
        let core = a_core();
        let config = Config::parse_from(["corral", "--cpus", &core, "--workers", "2", "--", "w"]);
        let error = single_placed(&config, &|id| id == "workers").unwrap_err();
        assert_eq!(error.key, "workers");
        assert!(error.problem.contains("cores in cpus"), "names both keys: {}", error.problem);
        let config = Config::parse_from(["corral", "--cpus", &core]);
        let error = single_placed(&config, &|_| false).unwrap_err();
        assert_eq!(error.key, "cpus");
        let config = Config::parse_from(["corral", "--cpus", "4095", "--", "w"]);
        let error = single_placed(&config, &|_| false).unwrap_err();
        assert_eq!(error.key, "cpus");
        assert!(error.problem.contains("not available"), "{}", error.problem);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_set_cpus_flag_wins_over_a_stages_cpus() {
        let core = a_core();
        let text = "[stages.a]\ncommand = [\"w\"]\ncpus = [4095]\nworkers = 1\n";
        let topology = resolve_with(text, &["--cpus", &core], &["cpus"]).unwrap();
        assert_eq!(topology.stages[0].cpus, vec![core.parse::<usize>().unwrap()]);
        let error = resolve_with(text, &[], &[]).unwrap_err();
        assert_eq!(error.key, "stages.a.cpus", "the file's own cores, checked when not replaced");
        // With several stages one list would put all their workers on the same cores.
        let two = format!(
            "{text}[stages.b]\ncommand = [\"w\"]\n[pipelines.p]\nstages = [\"a\", \"b\"]\n"
        );
        let error = resolve_with(&two, &["--cpus", &core], &["cpus"]).unwrap_err();
        assert_eq!(error.key, "cpus");
        assert!(error.problem.contains("its own `cpus`"), "{error}");
    }

    #[test]
    fn a_route_path_defaults_to_its_name() {
        let text = "[stages.a]\n[routes.embed]\npipeline = \"a\"\ntimeout_ms = 50\n";
        let route = &resolve_with(text, &[], &[]).unwrap().routes[0];
        assert_eq!((route.path.as_str(), route.timeout), ("/embed", Duration::from_millis(50)));
    }

    #[test]
    fn a_route_may_speak_a_known_protocol() {
        let route = "[stages.a]\n[routes.embed]\npipeline = \"a\"\n";
        let text = format!("{route}protocol = \"openai-embeddings\"\n");
        let resolved = &resolve_with(&text, &[], &[]).unwrap().routes[0];
        assert_eq!(resolved.protocol, Some(Protocol::OpenAiEmbeddings));
        assert_eq!(resolved.model, "embed");
        let error = resolve_with(&format!("{route}protocol = \"grpc\"\n"), &[], &[]).unwrap_err();
        assert_eq!(error.key, "routes.embed.protocol");
        assert!(error.problem.contains("openai-embeddings"), "{}", error.problem);
    }

    #[test]
    fn a_batch_byte_budget_comes_from_the_stage_the_file_or_the_default() {
        let text = "max_batch_bytes = 5000\n[stages.a]\n[stages.b]\nmax_batch_bytes = 100\n\
                    [pipelines.p]\nstages = [\"a\", \"b\"]\n";
        let topology = resolve_with(text, &[], &[]).unwrap();
        let budgets: Vec<u64> = topology.stages.iter().map(|s| s.max_batch_bytes).collect();
        assert_eq!(budgets, [5000, 100]);
        let topology = resolve_with("[stages.a]\n", &[], &[]).unwrap();
        assert_eq!(topology.stages[0].max_batch_bytes, crate::config::DEFAULT_MAX_BATCH_BYTES);
    }

    #[test]
    fn a_batch_byte_budget_past_what_a_full_frame_carries_is_refused() {
        let most = crate::frame_payload_bytes(32);
        let text = format!("[stages.a]\nmax_batch_bytes = {}\n", most + 1);
        let error = resolve_with(&text, &[], &[]).unwrap_err();
        assert_eq!(error.key, "stages.a.max_batch_bytes");
        assert!(error.problem.contains(&format!("1..={most}")), "{}", error.problem);
        let text = format!("[stages.a]\nmax_batch_bytes = {most}\n");
        assert!(resolve_with(&text, &[], &[]).is_ok(), "the most a frame of 32 jobs carries");
        // The bound is the stage's own batch size: a batch of one job carries more.
        let text = format!("[stages.a]\nmax_batch_size = 1\nmax_batch_bytes = {}\n", most + 1);
        assert!(resolve_with(&text, &[], &[]).is_ok(), "a frame of 1 job carries more than of 32");
        let flag = (most + 1).to_string();
        let config = Config::parse_from(["corral", "--max-batch-bytes", &flag, "--", "w"]);
        assert_eq!(single_placed(&config, &|_| false).unwrap_err().key, "max_batch_bytes");
    }

    #[test]
    fn the_default_route_is_model_default() {
        let topology = resolve_with("[stages.a]\n", &[], &[]).unwrap();
        assert_eq!(topology.routes[0].model, DEFAULT_MODEL);
    }
}
