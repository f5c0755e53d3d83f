//! The `corral` binary: parse the options, keep off the cores pinned workers own, start the
//! runtime, set up logging, run until a stop signal (SIGTERM, SIGINT, SIGQUIT, SIGHUP).

use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

use corral::config::{topology, Config, LogFormat};
use corral::supervisor::output;

mod allocator;

/// The guard of the non-blocking writer of the log lines (`supervisor::output::log_writer`):
/// dropped, it lets the last lines out (1.1 s at most where stderr is read; see
/// [`flush_output`] for where it is not).
static LOG_GUARD: Mutex<Option<WorkerGuard>> = Mutex::new(None);

/// Lets the lines still queued (workers' output, log lines) out before the process exits,
/// waiting a second or two at most for a stream nobody reads.
fn flush_output() {
    output::flush(std::time::Duration::from_secs(1));
    let Some(guard) = LOG_GUARD.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
    // tracing-appender's guard, dropped, waits for its thread (100 ms to ask it, a second for
    // it) and, if its queue stays full, `println!`s that it could not stop it: on a stdout
    // nobody reads, blocked for ever (a SIGTERM then never ended the process). Dropped on a
    // thread of its own, waited for a little longer than it waits; the exit then ends that
    // thread. Should the thread not start, the guard is not dropped at all (`ManuallyDrop`):
    // its last lines are lost, not the exit.
    let guard = std::mem::ManuallyDrop::new(guard);
    let (dropped, done) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("corral-log-end".into()).spawn(move || {
        drop(std::mem::ManuallyDrop::into_inner(guard));
        let _ = dropped.send(());
    });
    if spawned.is_ok() {
        let _ = done.recv_timeout(std::time::Duration::from_millis(1200));
    }
}

fn main() -> std::process::ExitCode {
    let matches = Config::command().try_get_matches().unwrap_or_else(|e| exit_on(e));
    let mut config = Config::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if matches.value_source("worker_env") == Some(ValueSource::EnvVariable) {
        config.split_worker_env();
    }
    // Flags and variables that were set win over the config file.
    let explicit = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    let checked = topology::load(&mut config, &explicit).and_then(|topology| {
        match config.traces_endpoint() {
            Some(endpoint) => corral::trace::check(&endpoint)
                .map_err(|e| {
                    let from_env =
                        matches.value_source("otlp_endpoint") == Some(ValueSource::EnvVariable);
                    format!("{}: {e}", endpoint_source(&config, &explicit, from_env))
                })
                .and_then(|()| corral::trace::check_headers())
                .map(|()| topology)
                .map_err(Into::into),
            None => Ok(topology),
        }
    });
    let topology = match checked {
        Ok(topology) => topology,
        Err(problem) => {
            // Before anything starts, and before logging is set up: plainly, like clap's errors
            // (and not with eprintln!, which panics where nobody reads stderr any more). A value
            // named as its flag that came from its variable is said to, as clap's errors are.
            let tip = problem.flag.as_deref().and_then(from_variable).map(|variable| {
                format!("\n\n  tip: the value is {variable}'s, from the environment")
            });
            let (message, tip) = (problem.message, tip.unwrap_or_default());
            let _ = writeln!(std::io::stderr(), "error: {message}{tip}");
            return std::process::ExitCode::from(2);
        }
    };
    // Log lines and workers' output are written by threads of their own, never blocking the
    // runtime's (a stdout or stderr nobody reads once froze the proxy, signals and all).
    let (stderr, guard) = output::log_writer();
    *LOG_GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
    let (filter, unread_filter) = log_filter();
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(stderr);
    match config.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => {
            logs.json().flatten_event(true).with_current_span(true).init();
            output::as_json();
        }
    }
    if let Some(why) = unread_filter {
        tracing::warn!("{why}; logging at info");
    }
    warn_of_unused_options(&config, &topology, &explicit);
    warn_of_a_model_named_stats(&topology);
    warn_of_stream_timeouts_no_stream_reaches(&config, &topology);
    warn_of_a_socket_its_workers_cannot_open(&config, &topology);
    keep_off_pinned_cores(&topology);
    let code = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(serve(config, topology)),
        Err(e) => {
            tracing::error!(error = %e, "corral could not start its async runtime");
            std::process::ExitCode::FAILURE
        }
    };
    flush_output();
    code
}

/// Where the traces endpoint came from, for its error (which had named neither the key nor the
/// file): the option, its variable (`from_env`: a manifest's `env:` list shows no flag), the
/// file's key, or OpenTelemetry's variables ([`Config::traces_endpoint`]).
fn endpoint_source(config: &Config, explicit: &dyn Fn(&str) -> bool, from_env: bool) -> String {
    let given = config.otlp_endpoint.as_deref().is_some_and(|url| !url.trim().is_empty());
    match (&config.config, given) {
        (Some(file), true) if !explicit("otlp_endpoint") => {
            format!("config file {}: otlp_endpoint", file.display())
        }
        (_, true) if from_env => "CORRAL_OTLP_ENDPOINT (--otlp-endpoint)".into(),
        (_, true) => "--otlp-endpoint".into(),
        // The one read, as `Config::traces_endpoint` reads them: the traces' own first.
        (_, false) => ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
            .into_iter()
            .find(|name| std::env::var(name).is_ok_and(|value| !value.trim().is_empty()))
            .unwrap_or("OTEL_EXPORTER_OTLP_ENDPOINT")
            .into(),
    }
}

/// clap's error, exit 2 (help and version: their text, exit 0). A bad value that came from a
/// `CORRAL_*` variable rather than the command line is said to: clap names only the flag, and
/// in a manifest's `env:` list the flag is nowhere to be seen.
fn exit_on(mut error: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    // Not where the command line holds the bytes: clap's words are right there.
    let arguments_are_text = std::env::args_os().all(|word| word.to_str().is_some());
    if error.kind() == ErrorKind::InvalidUtf8 && arguments_are_text {
        // clap says only "invalid UTF-8 was detected in one or more arguments": name the
        // variable (and its flag) whose value it was, where one was.
        let command = Config::command();
        let not_text = command.get_arguments().find_map(|flag| {
            let variable = flag.get_env()?;
            let value = std::env::var_os(variable)?;
            let long = flag.get_long()?;
            value.to_str().is_none().then(|| (variable.to_string_lossy().into_owned(), long))
        });
        if let Some((variable, long)) = not_text {
            let _ = writeln!(
                std::io::stderr(),
                "error: {variable} (--{long}) holds bytes that are not UTF-8; a value is text"
            );
            std::process::exit(2);
        }
    }
    let bad_value = matches!(error.kind(), ErrorKind::InvalidValue | ErrorKind::ValueValidation);
    let variable = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) if bad_value => from_variable(arg),
        _ => None,
    };
    if let Some(variable) = variable {
        let tip = format!("the value is {variable}'s, from the environment");
        error.insert(ContextKind::Suggested, ContextValue::StyledStrs(vec![tip.into()]));
    }
    error.exit()
}

/// The variable a flag's value came from: `arg` as clap shows it (`--max-batch-size <N>`), when
/// that flag has a variable, the variable is set, and the command line does not give the flag.
fn from_variable(arg: &str) -> Option<String> {
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let command = Config::command();
    let flag = command.get_arguments().find(|flag| flag.get_long() == Some(long))?;
    let variable = flag.get_env()?.to_string_lossy().into_owned();
    std::env::var_os(&variable)?;
    let given = std::env::args().any(|word| {
        word.strip_prefix("--")
            .is_some_and(|word| word == long || word.starts_with(&format!("{long}=")))
    });
    (!given).then_some(variable)
}

/// Spawned workers run as Corral's own user: a socket mode that lets its owner not write keeps
/// every one of them out (they crash-loop on EACCES). Root gets in whatever the mode says, so a
/// warning, not an error.
fn warn_of_a_socket_its_workers_cannot_open(config: &Config, topology: &topology::Topology) {
    let spawns = topology.stages.iter().any(topology::StageSpec::spawns);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if spawns && config.socket_mode & 0o200 == 0 && !root {
        tracing::warn!(
            socket_mode = format!("{:o}", config.socket_mode),
            "--socket-mode lets the socket's owner not write it, and the workers Corral spawns \
             run as that owner: none can connect (use 600 or 660)"
        );
    }
}

/// Options that were set but shape only what Corral spawns, where nothing is spawned (or, for
/// `--workers-per-gpu`, nothing is placed): warnings, not errors, so that a deployment setting
/// `CORRAL_*` for external workers keeps starting. Asked of what was resolved, a config file's
/// stages too (a file had silenced them all).
fn warn_of_unused_options(
    config: &Config,
    topology: &topology::Topology,
    explicit: &dyn Fn(&str) -> bool,
) {
    let spawns = topology.stages.iter().any(topology::StageSpec::spawns);
    // A config file's top-level `workers` and `worker_env` as the flags (a file had been
    // silent where the flags warn).
    if !spawns && (explicit("workers") || config.workers != 1) {
        tracing::warn!(
            workers = config.workers,
            "--workers (or a config file's `workers`) counts the workers Corral spawns, and no \
             worker command follows `--` \
             (nor has any stage of a config file a `command`): none is spawned, workers are \
             expected to connect on their own"
        );
    }
    if !spawns && (explicit("worker_env") || !config.file_worker_env.is_empty()) {
        tracing::warn!(
            "--worker-env (or a config file's `worker_env`) sets the environment of the workers \
             Corral spawns, and no worker \
             command follows `--` (nor has any stage of a config file a `command`): it is not \
             used"
        );
    }
    // A file's top-level key as the flag: one file shared by GPU and CPU nodes (CORRAL_GPUS
    // set on the first) keeps starting on the second.
    let placed = topology.stages.iter().any(|stage| !stage.gpus.is_empty());
    if !placed && (explicit("workers_per_gpu") || config.workers_per_gpu != 1) {
        tracing::warn!(
            workers_per_gpu = config.workers_per_gpu,
            "--workers-per-gpu (or a config file's `workers_per_gpu`) places workers on the \
             devices of --gpus (or a config file's `gpus`), and none are given: it is not used"
        );
    }
}

/// The log filter: `RUST_LOG`'s, or `info`; with why `RUST_LOG` was not read, if it is set and
/// is no filter (`corral=verbose`, a level misspelt), to be said once logging is up (it had been
/// replaced by `info` without a word, and an operator read its silence as nothing to log).
fn log_filter() -> (EnvFilter, Option<String>) {
    let info = || EnvFilter::new("info");
    match std::env::var(EnvFilter::DEFAULT_ENV) {
        // Empty as unset: an empty filter logs nothing, not even errors.
        Err(std::env::VarError::NotPresent) => (info(), None),
        // No directive in it (`""`, `","`) as unset too.
        Ok(text) if directives(&text).next().is_none() => (info(), None),
        Err(std::env::VarError::NotUnicode(_)) => (info(), Some("RUST_LOG is not UTF-8".into())),
        Ok(written) => {
            // Read as its directives, each trimmed: the filter's own reading keeps a space, and
            // `hyper=debug, warn` was a filter for a target named " warn", nothing of Corral's.
            let text = directives(&written).collect::<Vec<_>>().join(",");
            match EnvFilter::try_new(&text) {
                Ok(filter) if sets_corral_s_level(&text) => (filter, None),
                // `RUST_LOG=warning` parsed, a filter for a target named `warning`, and every
                // line of Corral's went unlogged, a fatal error's included: logged at info.
                Ok(_) => {
                    let why = format!(
                        "RUST_LOG={written:?} sets no level for Corral's own lines{}",
                        bare_words_hint(&text)
                    );
                    let filter = EnvFilter::try_new(format!("corral=info,{text}"))
                        .unwrap_or_else(|_| info());
                    (filter, Some(why))
                }
                Err(e) => (info(), Some(format!("RUST_LOG={written:?} is not a log filter: {e}"))),
            }
        }
    }
}

/// Said of a filter's words that are neither a level nor `target=level` (`warning`), and of
/// targets that name Corral in another case (`Corral=debug`), if any.
fn bare_words_hint(text: &str) -> String {
    let words: Vec<&str> = directives(text)
        .filter(|d| !d.contains(['=', '[']) && d.parse::<LevelFilter>().is_err())
        .collect();
    let mut hint = String::new();
    if !words.is_empty() {
        hint.push_str(&format!(
            " ({words:?}: a word alone names a target, not a level; the levels are trace, debug, \
             info, warn, error and off)"
        ));
    }
    let cased =
        directives(text).map(|d| d.split(['=', '[']).next().unwrap_or_default()).find(|target| {
            let lower = target.to_ascii_lowercase();
            lower.starts_with("corral") && !target.starts_with("corral")
        });
    if let Some(target) = cased {
        hint.push_str(&format!(
            " ({target:?}: targets are matched as written; Corral's is corral)"
        ));
    }
    hint
}

fn directives(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|directive| !directive.is_empty())
}

/// Whether a filter sets a level for all of Corral's own lines: a directive of a level alone,
/// or one for the target `corral` or a start of it (`corral`, `c`), outside any span. A filter
/// naming other targets only (`hyper=debug`, `warning`), or a part of Corral (`corral::http`,
/// `corral[request]`), logs none of the rest, the error Corral exits with included.
fn sets_corral_s_level(text: &str) -> bool {
    directives(text).any(|directive| {
        if directive.contains('[') {
            return false;
        }
        let target = directive.split('=').next().unwrap_or_default();
        if !directive.contains('=') && target.parse::<LevelFilter>().is_ok() {
            return true;
        }
        !target.is_empty() && "corral".starts_with(target)
    })
}

/// A route named `stats` serves a model v2 cannot wholly ask for: `/v2/models/stats` is the
/// statistics of every model, as in Triton. A warning, not an error: the route and its other
/// protocols serve as before (refused, a file that started yesterday would not today).
fn warn_of_a_model_named_stats(topology: &topology::Topology) {
    if topology.routes.iter().any(|route| route.model == "stats") {
        tracing::warn!(
            "route \"stats\": Open Inference v2's /v2/models/stats is the statistics of every \
             model (Triton's), so v2 clients cannot ask for this model's metadata there (its \
             other v2 endpoints, and KServe v1, serve); name the route otherwise"
        );
    }
}

/// A stage's own `stream_timeout_ms` bounds the streamed answers it gives, and only a route's
/// last stage gives any (a worker of an earlier stage may not declare `stream`): on a stage last
/// in no route it bounds nothing, and had been taken without a word.
fn warn_of_stream_timeouts_no_stream_reaches(config: &Config, topology: &topology::Topology) {
    let everywhere = std::time::Duration::from_millis(config.stream_timeout_ms);
    for stage in topology.stages.iter().filter(|stage| stage.stream_timeout != everywhere) {
        let last = topology.routes.iter().any(|route| route.stages.last() == Some(&stage.name));
        if !last {
            tracing::warn!(
                stage = %stage.name,
                "this stage's stream_timeout_ms bounds the streamed answers it gives, and only a \
                 route's last stage gives any: it is the last of no route, so its \
                 stream_timeout_ms is not used"
            );
        }
    }
}

/// Keeps the proxy off the cores the stages pin their workers to. Before the runtime starts its
/// threads, so that each of them inherits the mask (see `supervisor::affinity`).
fn keep_off_pinned_cores(topology: &topology::Topology) {
    let pinned: BTreeSet<usize> =
        topology.stages.iter().flat_map(|stage| stage.cpus.iter().copied()).collect();
    match corral::supervisor::affinity::keep_off(&pinned) {
        Ok(Some(cores)) => {
            tracing::info!(?cores, ?pinned, "the proxy runs on the cores no worker is pinned to")
        }
        Ok(None) if !pinned.is_empty() => {
            tracing::warn!(?pinned, "every core is pinned to a worker: the proxy shares them")
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, ?pinned, "could not keep the proxy off the pinned cores")
        }
    }
}

/// Runs the proxy until a stop signal: the exit code says how it ended.
async fn serve(config: Config, topology: topology::Topology) -> std::process::ExitCode {
    match corral::run(config, topology, stop_signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "corral could not run");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Completes on the first SIGINT, SIGTERM, SIGQUIT or SIGHUP; a second one exits at once, killing
/// the spawned workers first (the orderly stop that would have ended them is cut short). SIGQUIT,
/// which some images give as their stop signal (nginx's graceful stop), dumped core on the spot:
/// requests in flight had no answer, and a worker's own children were left running. SIGHUP (its
/// terminal gone; Corral reloads nothing) took the default action before: an exit on the spot,
/// jobs dropped and the socket file left behind. Where it was ignored when Corral started (run
/// under `nohup`), it stays ignored: a listener would replace the disposition asked for.
///
/// The handlers are installed when this is called, before anything listens, not when the future
/// is first polled: a SIGTERM that came as soon as the proxy listened took the default action
/// then, and ended it without a drain and with its socket file left behind.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    let mut term = signal(SignalKind::terminate()).expect("can install a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("can install a SIGINT handler");
    let mut quit = signal(SignalKind::quit()).expect("can install a SIGQUIT handler");
    let mut hup = (!hangup_ignored())
        .then(|| signal(SignalKind::hangup()).expect("can install a SIGHUP handler"));
    async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = quit.recv() => {}
            _ = hangup(&mut hup) => {}
        }
        second_signal(Stops { term, int, quit, hup });
    }
}

/// The stop signals Corral listens for.
struct Stops {
    term: Signal,
    int: Signal,
    quit: Signal,
    hup: Option<Signal>,
}

impl Stops {
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            _ = self.quit.recv() => {}
            _ = hangup(&mut self.hup) => {}
        }
    }
}

/// A second stop signal this soon after the first is the same stop delivered twice (`timeout`
/// signals its child and then the child's process group; so do some init systems), not an
/// operator asking twice: it skipped the drain in one run of ten.
const SAME_STOP: std::time::Duration = std::time::Duration::from_millis(250);

/// A SIGHUP, where Corral listens for one; else never.
async fn hangup(hup: &mut Option<Signal>) {
    match hup {
        Some(hup) => {
            hup.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Whether SIGHUP was ignored when Corral started, as `nohup` leaves it.
fn hangup_ignored() -> bool {
    // SAFETY: with a null new action, sigaction only writes the current one into `old`, a
    // zeroed sigaction (a valid value of the plain C struct).
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// After the first stop signal, the second (from [`SAME_STOP`] on) exits at once.
fn second_signal(mut stops: Stops) {
    let first = std::time::Instant::now();
    tokio::spawn(async move {
        loop {
            stops.recv().await;
            if first.elapsed() >= SAME_STOP {
                break;
            }
        }
        tracing::warn!("second signal: exiting now");
        corral::supervisor::group::kill_all();
        corral::worker::listener::remove_published();
        flush_output();
        std::process::exit(1);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_sets_corral_s_level_by_a_level_alone_or_a_target_of_its_own() {
        for text in ["warn", "INFO", "off", "hyper=debug,error", "corral", "corral=off", "c=warn"] {
            assert!(sets_corral_s_level(text), "{text}");
        }
        let parts = ["corral::http=debug", "corral::http", "corral[req]=debug", "corralx=info"];
        let others = ["warning", "infoo", "hyper=debug", "[span]=debug", "h2,tokio=trace"];
        for text in others.into_iter().chain(parts) {
            assert!(!sets_corral_s_level(text), "{text}");
        }
    }

    #[test]
    fn the_hint_names_bare_words_and_corral_written_in_another_case() {
        assert!(bare_words_hint("warning").contains("a word alone names a target"));
        for text in ["Corral=debug", "CORRAL", "hyper=info,Corral::http=debug"] {
            let hint = bare_words_hint(text);
            assert!(hint.contains("targets are matched as written; Corral's is corral"), "{text}");
        }
        assert_eq!(bare_words_hint("hyper=debug,corral::http=debug"), "");
    }
}
