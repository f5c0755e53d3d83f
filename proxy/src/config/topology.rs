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
use crate::traffic::Class;
use workers::{check_cores_shared, check_cpus, pinned_workers, place, resolve_gpus, Keys};

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
    /// Longest a worker may hold a batch (None: the longest timeout among its jobs' routes plus
    /// a margin).
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

impl StageSpec {
    /// Whether Corral spawns this stage's workers (it has a command).
    pub fn spawns(&self) -> bool {
        !self.command.is_empty()
    }

    /// The workers Corral spawns for this stage: none where its workers start elsewhere.
    pub fn spawned_workers(&self) -> u32 {
        if self.spawns() {
            self.workers
        } else {
            0
        }
    }
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
pub fn load(config: &mut Config, explicit: &dyn Fn(&str) -> bool) -> Result<Topology, LoadError> {
    let Some(path) = config.config.clone() else {
        return single_placed(config, explicit).map_err(LoadError::from);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read the config file {}: {e}", path.display()))?;
    let shown = path.display();
    let file = file::parse(&text).map_err(|e| format!("config file {shown}: {e}"))?;
    resolve(config, file, explicit).map_err(|e| match e.key.starts_with("--") {
        // A value from the command line or the environment, named as its flag: not the file's.
        true => LoadError::from(e),
        false => format!("config file {shown}: {e}").into(),
    })
}

/// Why the configuration cannot be served: what to say, and the flag whose value it was, if it
/// came from the command line or the environment (the caller says which, as clap does).
#[derive(Debug)]
pub struct LoadError {
    pub message: String,
    pub flag: Option<String>,
}

impl From<String> for LoadError {
    fn from(message: String) -> Self {
        Self { message, flag: None }
    }
}

impl From<ConfigError> for LoadError {
    fn from(error: ConfigError) -> Self {
        let flag = error.key.starts_with("--").then(|| error.key.clone());
        Self { message: error.to_string(), flag }
    }
}

/// The worker socket's path, as far as it can be checked before binding
/// ([`crate::worker::listener::path_problem`]); `key` names where it came from.
fn check_socket(key: &str, path: &std::path::Path) -> Result<(), ConfigError> {
    match crate::worker::listener::path_problem(path) {
        Some(problem) => Err(error(key, format!("{}: {problem}", path.display()))),
        None => Ok(()),
    }
}

/// The topology of a proxy configured by flags alone, its workers placed. Its errors name the
/// flags, as a file's do for a value from the command line (`--workers: …`).
fn single_placed(
    config: &Config,
    explicit: &dyn Fn(&str) -> bool,
) -> Result<Topology, ConfigError> {
    // Clap checks each flag alone; this one is bounded by another (--max-batch-size).
    batch_bytes("--max-batch-bytes", config.max_batch_bytes, config.max_batch_size)?;
    check_socket("--socket", &config.socket)?;
    command_line_program(config)?;
    let mut topology = single(config);
    let spec = &mut topology.stages[0];
    if config.gpus.is_some() && spec.command.is_empty() {
        // Before `all` asks the machine: with no GPU found (up to 10 s of nvidia-smi), that was
        // the error given, not the missing command.
        let problem = "only spawned workers can be given GPUs; add a worker command";
        return Err(error("--gpus", problem));
    }
    let gpus = match &config.gpus {
        Some(text) => resolve_gpus("--gpus", text)?,
        None => Vec::new(),
    };
    let asked = explicit("workers").then_some(config.workers);
    if !config.cpus.is_empty() {
        spec.workers = pinned_workers(&config.cpus, asked, "--cpus", "--workers")?;
        if spec.command.is_empty() {
            let problem = "only spawned workers can be pinned; add a worker command after `--`";
            return Err(error("--cpus", problem));
        }
        check_cpus("--cpus", &config.cpus)?;
        spec.cpus = config.cpus.clone();
    }
    let keys = Keys {
        gpus: "--gpus".into(),
        per_gpu: "--workers-per-gpu".into(),
        workers: "--workers".into(),
        cpus: "--cpus".into(),
        env: "--worker-env".into(),
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

/// Sets `config.$field` from the file's top level unless the option was set explicitly, and
/// `written.$field` in any case: the file as written is checked whatever overrides it.
macro_rules! top_level {
    ($config:ident, $written:ident, $file:ident, $explicit:ident, $($field:ident),+) => {
        $(if let Some(value) = $file.$field.take() {
            $written.$field = value.clone();
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
    // The file's values as written, over the options: checked as the options are (below), so
    // that a value a flag or variable overrides is still refused. Passed over, a broken file
    // started until the deploy that dropped the variable, and failed there.
    let mut written = config.clone();
    let f = &mut file;
    let file_batch_bytes = f.max_batch_bytes.is_some();
    let file_socket = f.socket.is_some();
    if f.socket.as_ref().is_some_and(|path| path.as_os_str().is_empty()) {
        // As `--socket ''` is: it had bound HTTP first, then failed on the directory.
        return Err(error("socket", "an empty path; name the socket file workers connect to"));
    }
    top_level!(config, written, f, explicit, listen, socket, log_format, retries, timeout_ms);
    // Only the path that is bound: a file's `socket` in a directory only production has (a
    // container's volume) is no error where --socket or CORRAL_SOCKET overrides it.
    let socket_key = if file_socket && !explicit("socket") { "socket" } else { "--socket" };
    check_socket(socket_key, &config.socket)?;
    top_level!(config, written, f, explicit, max_body_bytes, max_connections);
    top_level!(config, written, f, explicit, header_read_timeout_ms, body_read_timeout_ms);
    top_level!(config, written, f, explicit, idle_timeout_ms, max_header_bytes, max_headers);
    top_level!(config, written, f, explicit, queue_capacity_bytes, stream_timeout_ms);
    top_level!(config, written, f, explicit, stream_buffer_bytes, priority_aging_ms);
    top_level!(config, written, f, explicit, tenant_queue_share, http2_max_streams);
    top_level!(config, written, f, explicit, stream_keepalive_ms);
    if let Some(weight) = f.max_batch_weight.take() {
        written.max_batch_weight = Some(weight);
        if !explicit("max_batch_weight") {
            config.max_batch_weight = Some(weight);
        }
    }
    if let Some(name) = f.tenant_header.take() {
        let name = parse_header_name(&name).map_err(|problem| error("tenant_header", problem))?;
        if !explicit("tenant_header") {
            config.tenant_header = name;
        }
    }
    top_level!(config, written, f, explicit, grace_period_ms, max_batch_size, max_wait_ms);
    top_level!(config, written, f, explicit, batch_policy, max_batch_bytes, shared_memory_bytes);
    top_level!(config, written, f, explicit, worker_prefetch, batch_timeout_ms, queue_capacity);
    top_level!(config, written, f, explicit, workers, workers_per_gpu);
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
    check_options(&written)?;
    if file_batch_bytes {
        batch_bytes("max_batch_bytes", written.max_batch_bytes, written.max_batch_size)?;
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
            "--cpus",
            "it pins the workers of a file's only stage; with several stages, give each stage \
             its own `cpus`",
        ));
    }
    let mut stages = Vec::new();
    for (name, stage) in std::mem::take(&mut file.stages) {
        stages.push(stage_spec(config, &written, &name, stage, explicit)?);
    }
    check_cores_shared(&stages)?;
    if config.gpus.is_some() && stages.iter().all(|stage| stage.command.is_empty()) {
        let problem = "only spawned workers can be given GPUs, and no stage has a `command`";
        return Err(error(if explicit("gpus") { "--gpus" } else { "gpus" }, problem));
    }
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
        let mut paths: HashMap<String, &str> = HashMap::new();
        for (name, route) in &file.routes {
            let key = format!("routes.{name}");
            check_model_name(name)?;
            let path = route.path.clone().unwrap_or_else(|| format!("/{name}"));
            // A path made from the route's name is the name's fault: `routes.x.path` had been
            // blamed in a file that wrote no `path`.
            match route.path {
                Some(_) => check_path(&format!("{key}.path"), &path)?,
                None => check_path(&key, &path).map_err(|e| {
                    error(
                        &key,
                        format!(
                            "its path, made from its name, would be {}: name the route \
                             otherwise, or give it a `path`",
                            e.problem
                        ),
                    )
                })?,
            }
            // As requests are matched: sent as written, or percent-decoded (`/%C3%BC` is `/ü`).
            if let Some(other) = paths.insert(plain_path(&path), name) {
                let problem = format!("{path} is served twice: routes.{other} serves it too");
                return Err(error(format!("{key}.path"), problem));
            }
            let Some(pipeline) = pipelines.get(&route.pipeline) else {
                let problem = if pipelines.is_empty() {
                    // Only a lone stage is a pipeline of itself: with two or more, which run in
                    // which order is the file's to say.
                    format!(
                        "no pipeline named {:?} (none declared); with more than one stage, \
                         declare each pipeline as [pipelines.NAME] stages = [...]",
                        route.pipeline
                    )
                } else {
                    let names: HashSet<&str> = pipelines.keys().map(String::as_str).collect();
                    format!("no pipeline named {:?} (pipelines: {})", route.pipeline, list(&names))
                };
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
    // So is a declared pipeline no route serves (its stages used by others): it had been
    // taken silently, the route meant for it perhaps naming another.
    let served: HashSet<&str> = routes.iter().map(|r| r.pipeline.as_str()).collect();
    if let Some(idle) = file.pipelines.keys().find(|name| !served.contains(name.as_str())) {
        return Err(error(format!("pipelines.{idle}"), "no route serves this pipeline"));
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

/// A route's name is its model's name in the model-serving protocols, where it is a path
/// segment (`/v2/models/NAME/infer`, `/v1/models/NAME:predict`): an empty one, or one with `/`
/// or `:`, could not be asked for there (tritonclient leaves `/` unquoted), though `/v1/models`
/// listed it.
fn check_model_name(name: &str) -> Result<(), ConfigError> {
    let problem = if name.is_empty() {
        "a route name is its model's name in v2 and KServe v1: it cannot be empty"
    } else if name == "." || name == ".." {
        "a route name is its model's name in v2 and KServe v1 paths, where clients resolve `.` \
         and `..` away: pick another"
    } else if name.contains(['/', ':']) {
        "a route name is its model's name in v2 and KServe v1 paths, where `/` and `:` cannot \
         stand: pick a name without them (the route's `path` may hold any)"
    } else if name.chars().any(char::is_control) {
        "a route name is its model's name, and holds no control characters"
    } else {
        return Ok(());
    };
    Err(error(format!("routes.{name:?}"), problem))
}

/// A stage of the file, resolved: `written` is the file's top level as written, over the
/// options (what the stage's own values are checked against).
fn stage_spec(
    config: &Config,
    written: &Config,
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
    // The stage's own values are checked whatever overrides them, as the top level's are.
    if let Some(size) = stage.max_batch_size {
        in_range(&key("max_batch_size"), size.into(), 1, MAX_BATCH_SIZE.into())?;
    }
    if let Some(bytes) = stage.max_batch_bytes {
        let size = stage.max_batch_size.unwrap_or(written.max_batch_size);
        batch_bytes(&key("max_batch_bytes"), bytes, size)?;
    }
    let own = [
        ("queue_capacity", stage.queue_capacity.map(u64::from)),
        ("queue_capacity_bytes", stage.queue_capacity_bytes),
        ("stream_timeout_ms", stage.stream_timeout_ms),
        ("max_batch_weight", stage.max_batch_weight),
    ];
    for (field, value) in own {
        value.map_or(Ok(()), |value| positive(&key(field), value))?;
    }
    for (field, value) in [("workers", stage.workers), ("workers_per_gpu", stage.workers_per_gpu)] {
        let most = MAX_WORKERS.into();
        value.map_or(Ok(()), |value| in_range(&key(field), value.into(), 1, most))?;
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
    let source = match (from_stage, explicit("max_batch_bytes")) {
        (true, _) => key("max_batch_bytes"),
        (false, true) => "--max-batch-bytes".into(),
        (false, false) => "max_batch_bytes".into(),
    };
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
        _ if !config.worker_cmd.is_empty() => {
            command_line_program(config)?;
            config.worker_cmd.clone()
        }
        Some(command) if command.is_empty() => {
            return Err(error(
                key("command"),
                "an empty command; leave the key out for workers started elsewhere",
            ));
        }
        Some(command) if command[0].is_empty() => {
            // No program has that name: as with a NUL, it would fail to start for ever.
            return Err(error(key("command"), "the program (its first word) is an empty string"));
        }
        Some(command) if command.iter().any(|word| word.contains('\0')) => {
            // No program can be given it: the worker would fail to start, again and again.
            return Err(error(key("command"), "holds a NUL byte, which no command can carry"));
        }
        Some(command) => command,
        None => Vec::new(),
    };
    if command.is_empty() {
        // A stage's own key that only shapes what Corral spawns, on a stage it spawns nothing
        // for: a mistake in the file (taken silently, `workers = 4` had started none).
        let spawn_keys = [
            ("workers", stage.workers.is_some()),
            ("workers_per_gpu", stage.workers_per_gpu.is_some()),
            ("env", stage.env.is_some()),
            ("gpus", stage.gpus.is_some()),
        ];
        if let Some((field, _)) = spawn_keys.into_iter().find(|(_, set)| *set) {
            let problem = "only shapes the workers Corral spawns, and this stage has no \
                           `command`: add one, or leave the key out for workers started elsewhere";
            return Err(error(key(field), problem));
        }
    }
    if stage.cpus.as_ref().is_some_and(Vec::is_empty) {
        // As `--cpus ''` is refused, and `gpus = []`: it had started the workers unpinned.
        return Err(error(key("cpus"), "an empty list; leave the key out for no pinning"));
    }
    // A set --cpus wins over the stage's own key, as every flag wins over the file.
    let (cpus, cpus_key) = if explicit("cpus") {
        (config.cpus.clone(), "--cpus".to_string())
    } else {
        (stage.cpus.unwrap_or_default(), key("cpus"))
    };
    let workers = match (stage.workers, cpus.len()) {
        (_, pinned) if pinned > 0 && explicit("workers") => {
            pinned_workers(&cpus, Some(config.workers), &cpus_key, "--workers")?
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
    // Each error names where its value came from: a flag (`--gpus`), the stage's own key, or
    // the file's top level. `stages.a.workers` had been named for a `--workers 3` the file
    // never held.
    let gpus_key = match (explicit("gpus"), stage.gpus.is_some()) {
        (true, _) => "--gpus".to_string(),
        (false, true) => key("gpus"),
        (false, false) => "gpus".to_string(),
    };
    let gpus = match (&stage.gpus, &config.gpus) {
        // The top level's devices (the file's, or --gpus) are for the stages Corral spawns
        // workers for; one whose workers start elsewhere takes none (`resolve` refuses them
        // where no stage spawns).
        (None, Some(_)) if command.is_empty() => Vec::new(),
        (_, Some(text)) if explicit("gpus") => resolve_gpus(&gpus_key, text)?,
        (Some(gpus), _) => resolve_gpus(&gpus_key, &gpus.text())?,
        (None, Some(text)) => resolve_gpus(&gpus_key, text)?,
        (None, None) => Vec::new(),
    };
    // Named in an error where it was written: the stage's key, else the file's top level
    // (the flag's own range is clap's to check).
    let (per_gpu, per_gpu_key) = match stage.workers_per_gpu {
        // The stage's own key where it gets no device: taken silently, it placed nothing.
        Some(_) if gpus.is_empty() => {
            let problem = "places workers on the stage's `gpus` (or the top level's), and it \
                           has none";
            return Err(error(key("workers_per_gpu"), problem));
        }
        Some(per) if !explicit("workers_per_gpu") => (per, key("workers_per_gpu")),
        _ if explicit("workers_per_gpu") => (config.workers_per_gpu, "--workers-per-gpu".into()),
        _ => (config.workers_per_gpu, "workers_per_gpu".into()),
    };
    in_range(&per_gpu_key, per_gpu.into(), 1, MAX_WORKERS.into())?;
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
    let keys = Keys {
        gpus: gpus_key,
        per_gpu: per_gpu_key,
        workers: if explicit("workers") { "--workers".into() } else { key("workers") },
        cpus: cpus_key,
        env: key("env"),
    };
    place(&mut spec, gpus, per_gpu, asked, env, config, &keys)?;
    Ok(spec)
}

/// The ranges clap enforces on flags, enforced on the file's top-level values too.
fn check_options(config: &Config) -> Result<(), ConfigError> {
    in_range("max_batch_size", config.max_batch_size.into(), 1, MAX_BATCH_SIZE.into())?;
    in_range("workers", config.workers.into(), 1, MAX_WORKERS.into())?;
    in_range("workers_per_gpu", config.workers_per_gpu.into(), 1, MAX_WORKERS.into())?;
    let (bytes, count) = (crate::config::HEADER_BYTES, crate::config::HEADERS);
    in_range("max_header_bytes", config.max_header_bytes as u64, *bytes.start(), *bytes.end())?;
    in_range("max_headers", config.max_headers as u64, *count.start(), *count.end())?;
    positive("timeout_ms", config.timeout_ms)?;
    positive("max_body_bytes", config.max_body_bytes as u64)?;
    positive("queue_capacity", config.queue_capacity.into())?;
    positive("queue_capacity_bytes", config.queue_capacity_bytes)?;
    positive("max_connections", config.max_connections.into())?;
    positive("http2_max_streams", config.http2_max_streams.into())?;
    positive("header_read_timeout_ms", config.header_read_timeout_ms)?;
    positive("body_read_timeout_ms", config.body_read_timeout_ms)?;
    positive("idle_timeout_ms", config.idle_timeout_ms)?;
    positive("stream_timeout_ms", config.stream_timeout_ms)?;
    positive("stream_buffer_bytes", config.stream_buffer_bytes)?;
    positive("priority_aging_ms", config.priority_aging_ms)?;
    let most = crate::config::MAX_KEEPALIVE_MS;
    in_range("stream_keepalive_ms", config.stream_keepalive_ms, 0, most)?;
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
    if path.contains(['?', '#', ' ', '{', '}']) {
        // Braces would be an OpenAPI path template with no parameter behind it.
        let problem = format!("{path:?}: a route path has no query, fragment, space or brace");
        return Err(error(key, problem));
    }
    // Checked as written and as decoded: either is how a client may reach it.
    let plain = plain_path(path);
    let dots = |path: &str| path.split('/').any(|segment| segment == "." || segment == "..");
    if dots(path) || dots(&plain) {
        // Clients resolve dot segments before sending (curl, browsers; WHATWG URLs `%2e%2e`
        // too): `/x/../healthz` would reach /healthz, never this route.
        let problem = format!("{path:?}: a route path has no `.` or `..` segment");
        return Err(error(key, problem));
    }
    if path.chars().chain(plain.chars()).any(char::is_control) {
        return Err(error(key, format!("{path:?}: a route path has no control characters")));
    }
    if RESERVED_PATHS.contains(&path) || RESERVED_PATHS.contains(&plain.as_str()) {
        return Err(error(key, format!("{path} is Corral's own route")));
    }
    let under = |prefix: &&&str| {
        [path, plain.as_str()]
            .iter()
            .any(|path| path.starts_with(**prefix) || *path == prefix.trim_end_matches('/'))
    };
    if let Some(prefix) = PROTOCOL_PREFIXES.iter().find(under) {
        let problem = format!("{path}: paths under {prefix} are the client protocols'");
        return Err(error(key, problem));
    }
    Ok(())
}

/// A route path percent-decoded (as written where it does not decode to UTF-8): what requests
/// are matched against, and what two routes may not both serve.
pub fn plain_path(path: &str) -> String {
    crate::http::percent_decoded(path).map_or_else(|| path.to_string(), |path| path.into_owned())
}

/// `corral -- ""`: no program has that name; it failed to start, again and again.
fn command_line_program(config: &Config) -> Result<(), ConfigError> {
    match config.worker_cmd.first() {
        Some(program) if program.is_empty() => {
            Err(error("--", "the worker command's program is an empty string"))
        }
        _ => Ok(()),
    }
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
    let jobs = workers::amount(max_batch_size as usize, "job");
    let problem = format!(
        "{value} is not in 1..={most} (what a frame of {jobs} carries under the worker \
         protocol's 64 MiB frame limit)"
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

mod workers;

#[cfg(test)]
mod tests;
