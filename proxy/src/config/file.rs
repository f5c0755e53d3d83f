//! The config file (`--config corral.toml`) as written: every key optional, unknown keys refused.
//!
//! Top-level keys are the command-line options under their long names with underscores
//! (`max_batch_size` for `--max-batch-size`); the stage options among them are defaults for every
//! stage. Then three tables: `[stages.NAME]`, `[pipelines.NAME]` and `[routes.NAME]`. Turning this
//! into what the proxy runs, with every check, is [`super::topology`]'s job.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::LogFormat;
use crate::stage::Policy;
use crate::traffic::Class;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// Written as `--listen` takes it (`localhost:8000`, `:8000` too).
    #[serde(default, deserialize_with = "listen")]
    pub listen: Option<SocketAddr>,
    pub socket: Option<PathBuf>,
    /// Octal, as a string ("660"): TOML has no octal literals that read naturally.
    pub socket_mode: Option<String>,
    pub log_format: Option<LogFormat>,
    pub retries: Option<u32>,
    pub timeout_ms: Option<u64>,
    pub max_body_bytes: Option<usize>,
    pub shared_memory_bytes: Option<usize>,
    pub max_connections: Option<u32>,
    pub http2_max_streams: Option<u32>,
    pub header_read_timeout_ms: Option<u64>,
    pub body_read_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub max_header_bytes: Option<usize>,
    pub max_headers: Option<usize>,
    pub grace_period_ms: Option<u64>,
    pub stream_buffer_bytes: Option<u64>,
    pub stream_keepalive_ms: Option<u64>,
    pub priority_aging_ms: Option<u64>,
    pub tenant_header: Option<String>,
    pub tenant_queue_share: Option<f64>,
    pub otlp_endpoint: Option<String>,
    pub trace_sample_ratio: Option<f64>,
    /// `NAME=VALUE` entries, as `--worker-env` takes them: for every spawned worker.
    pub worker_env: Option<Vec<String>>,
    // Defaults for every stage: the same keys as `StageFile`'s. Listed twice because serde cannot
    // flatten one struct into another that refuses unknown keys, and refusing typos matters more.
    pub max_batch_size: Option<u32>,
    pub max_batch_bytes: Option<u64>,
    pub max_wait_ms: Option<u64>,
    pub batch_policy: Option<Policy>,
    pub worker_prefetch: Option<bool>,
    pub batch_timeout_ms: Option<u64>,
    pub queue_capacity: Option<u32>,
    pub queue_capacity_bytes: Option<u64>,
    pub stream_timeout_ms: Option<u64>,
    pub max_batch_weight: Option<u64>,
    pub workers: Option<u32>,
    pub gpus: Option<Gpus>,
    pub workers_per_gpu: Option<u32>,

    #[serde(default)]
    pub stages: BTreeMap<String, StageFile>,
    #[serde(default)]
    pub pipelines: BTreeMap<String, PipelineFile>,
    #[serde(default)]
    pub routes: BTreeMap<String, RouteFile>,
}

/// `[stages.NAME]`: one step of a pipeline, its batching and its workers.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageFile {
    /// Worker command to spawn; without it the stage's workers are started elsewhere.
    pub command: Option<Vec<String>>,
    pub workers: Option<u32>,
    /// Cores to pin the spawned workers to, one worker per core.
    pub cpus: Option<Vec<usize>>,
    /// GPUs to spread the spawned workers over (`"all"`: the machine's).
    pub gpus: Option<Gpus>,
    pub workers_per_gpu: Option<u32>,
    /// Environment variables for the spawned workers; values may use `{index}` and `{gpu}`.
    pub env: Option<BTreeMap<String, String>>,
    pub max_batch_size: Option<u32>,
    pub max_batch_bytes: Option<u64>,
    pub max_wait_ms: Option<u64>,
    pub batch_policy: Option<Policy>,
    pub worker_prefetch: Option<bool>,
    pub batch_timeout_ms: Option<u64>,
    pub queue_capacity: Option<u32>,
    pub queue_capacity_bytes: Option<u64>,
    pub stream_timeout_ms: Option<u64>,
    pub max_batch_weight: Option<u64>,
}

/// A stage's devices as written: a list of indexes, or `"all"`.
#[derive(Debug, Clone, PartialEq)]
pub enum Gpus {
    List(Vec<u32>),
    Named(String),
}

/// Read by hand rather than as an untagged enum, whose error ("data did not match any variant
/// of untagged enum Gpus") named a Rust type instead of what the key takes.
impl<'de> Deserialize<'de> for Gpus {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Expected;
        impl<'de> serde::de::Visitor<'de> for Expected {
            type Value = Gpus;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"all\" or a list of device indices such as [0, 1]")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Gpus, E> {
                Ok(Gpus::Named(text.to_string()))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Gpus, A::Error> {
                let mut list = Vec::new();
                while let Some(index) = seq.next_element::<i64>()? {
                    let index = u32::try_from(index).map_err(|_| {
                        serde::de::Error::custom(format!(
                            "{index} is not a device index (0 and up, as nvidia-smi -L numbers them)"
                        ))
                    })?;
                    list.push(index);
                }
                Ok(Gpus::List(list))
            }
        }
        de.deserialize_any(Expected)
    }
}

impl Gpus {
    /// As `--gpus` spells it.
    pub fn text(&self) -> String {
        match self {
            Gpus::List(list) => list.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            Gpus::Named(name) => name.clone(),
        }
    }
}

/// `[pipelines.NAME]`: stages a job goes through, in order.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    pub stages: Vec<String>,
}

/// `[routes.NAME]`: an HTTP path served by a pipeline.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    /// Defaults to `/NAME`.
    pub path: Option<String>,
    pub pipeline: String,
    /// Default and longest deadline of this route's jobs.
    pub timeout_ms: Option<u64>,
    /// A client protocol this route also speaks (`openai-embeddings`), besides Corral's own.
    pub protocol: Option<String>,
    /// The priority class of its requests that send no `x-corral-priority`.
    pub priority: Option<Class>,
}

/// Parses the file's text; the error says where (line, column, key) and what is wrong.
pub fn parse(text: &str) -> Result<File, String> {
    toml::from_str(text).map_err(|e| {
        // A stage's own key at the top level: serde's "unknown field" listed the 40 top-level
        // keys, and not where this one goes.
        let top = toml::from_str::<toml::Table>(text).ok();
        let misplaced = top.and_then(|top| STAGE_ONLY.into_iter().find(|k| top.contains_key(*k)));
        match misplaced {
            Some(key) => format!(
                "{key}: a stage's own key, not a top-level one: put it under [stages.NAME] (the \
                 flags apply to the one stage of a file without stages)"
            ),
            None => e.to_string(),
        }
    })
}

/// The keys only a stage has (`[stages.NAME]`), no top-level default.
const STAGE_ONLY: [&str; 3] = ["command", "cpus", "env"];

/// `listen` read with `--listen`'s own parser.
fn listen<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(de)?;
    super::parse_listen(&text).map(Some).map_err(serde::de::Error::custom)
}
