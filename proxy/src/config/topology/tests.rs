//! The config file and the flags resolved into stages and routes: precedence (a flag set beats the
//! file, a stage key beats the top level), every config error naming its key, and the file that
//! `--help` shows loading as written.

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
    let help = include_str!("../after_help.txt");
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
fn a_value_a_flag_overrides_is_still_checked_as_written() {
    // The file must start the day the flag or variable is dropped: a broken value it hid had
    // passed until then (socket_mode and trace_sample_ratio were already checked so).
    let bad = [
        ("max_batch_size = 0\n[stages.a]\n", "max_batch_size"),
        ("queue_capacity = 0\n[stages.a]\n", "queue_capacity"),
        ("[stages.a]\nmax_batch_size = 99999\n", "stages.a.max_batch_size"),
        ("[stages.a]\nqueue_capacity = 0\n", "stages.a.queue_capacity"),
        ("[stages.a]\nstream_timeout_ms = 0\n", "stages.a.stream_timeout_ms"),
        ("[stages.a]\ncommand = [\"w\"]\nworkers = 0\n", "stages.a.workers"),
        ("max_batch_bytes = 0\n[stages.a]\n", "max_batch_bytes"),
        ("workers_per_gpu = 0\n[stages.a]\n", "workers_per_gpu"),
    ];
    let flags = [
        "--max-batch-size",
        "8",
        "--queue-capacity",
        "10",
        "--stream-timeout-ms",
        "1000",
        "--workers",
        "2",
        "--max-batch-bytes",
        "1048576",
        "--workers-per-gpu",
        "1",
    ];
    let set = [
        "max_batch_size",
        "queue_capacity",
        "stream_timeout_ms",
        "workers",
        "max_batch_bytes",
        "workers_per_gpu",
    ];
    for (text, key) in bad {
        let error = resolve_with(text, &flags, &set).unwrap_err().to_string();
        assert!(error.starts_with(&format!("{key}: ")), "{text:?}: {error}");
    }
    // Within range, the flag still wins.
    let topology = resolve_with("[stages.a]\nmax_batch_size = 4\n", &flags, &set).unwrap();
    assert_eq!(topology.stages[0].max_batch_size, 8);
}

#[test]
fn a_command_whose_program_is_empty_is_refused() {
    let error = resolve_with("[stages.a]\ncommand = [\"\", \"x\"]\n", &[], &[]).unwrap_err();
    assert!(error.to_string().starts_with("stages.a.command: "), "{error}");
    let config = Config::parse_from(["corral", "--", ""]);
    let error = single_placed(&config, &|_| false).unwrap_err();
    assert!(error.to_string().starts_with("--: "), "{error}");
    // With a file too: the command line's command is the stage's.
    let error = resolve_with("[stages.a]\n", &["--", ""], &[]).unwrap_err();
    assert!(error.to_string().starts_with("--: "), "{error}");
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
        "http2_max_streams",
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
        "stream_keepalive_ms",
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
    assert!(error.contains(&format!("core {core} is pinned by stages.a.cpus as well")), "{error}");
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
    assert_eq!(error.key, "--cpus");
    assert!(error.problem.contains("--gpus [0, 1] with --workers-per-gpu 1 place 2"), "{error}");
}

#[test]
#[cfg(target_os = "linux")]
fn the_cpus_flag_is_refused_against_workers_or_without_a_command() {
    let core = a_core();
    let config = Config::parse_from(["corral", "--cpus", &core, "--workers", "2", "--", "w"]);
    let error = single_placed(&config, &|id| id == "workers").unwrap_err();
    assert_eq!(error.key, "--workers");
    assert!(error.problem.contains("core in --cpus"), "names both keys: {}", error.problem);
    let config = Config::parse_from(["corral", "--cpus", &core]);
    let error = single_placed(&config, &|_| false).unwrap_err();
    assert_eq!(error.key, "--cpus");
    let config = Config::parse_from(["corral", "--cpus", "4095", "--", "w"]);
    let error = single_placed(&config, &|_| false).unwrap_err();
    assert_eq!(error.key, "--cpus");
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
    let two =
        format!("{text}[stages.b]\ncommand = [\"w\"]\n[pipelines.p]\nstages = [\"a\", \"b\"]\n");
    let error = resolve_with(&two, &["--cpus", &core], &["cpus"]).unwrap_err();
    assert_eq!(error.key, "--cpus");
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
    assert_eq!(single_placed(&config, &|_| false).unwrap_err().key, "--max-batch-bytes");
}

#[test]
fn the_default_route_is_model_default() {
    let topology = resolve_with("[stages.a]\n", &[], &[]).unwrap();
    assert_eq!(topology.routes[0].model, DEFAULT_MODEL);
}

#[test]
fn request_head_bounds_and_socket_modes_that_break_serving_are_refused() {
    // Every request answered 431 (0, 20), every one 413 past 64 MiB with a job budget of 0,
    // a start that panicked on overflow, 24 GB per 20 connections for a billion headers, and a
    // socket no worker could connect to: refused, from a flag and from the file alike.
    for (flag, value, key) in [
        ("--max-header-bytes", "255", "max_header_bytes"),
        ("--max-header-bytes", "67108864", "max_header_bytes"),
        ("--max-header-bytes", "18446744073709551615", "max_header_bytes"),
        ("--max-headers", "0", "max_headers"),
        ("--max-headers", "1000000000", "max_headers"),
    ] {
        let refused = Config::try_parse_from(["corral", flag, value]).unwrap_err().to_string();
        assert!(refused.contains("is not in"), "{flag} {value}: {refused}");
        let text = format!("{key} = {value}\n");
        if let Ok(parsed) = file::parse(&text) {
            let mut config = Config::parse_from(["corral"]);
            let error = resolve(&mut config, parsed, &|_| false).unwrap_err();
            assert_eq!(error.key, key, "{text}");
        }
    }
    for (flag, value) in [("--max-header-bytes", "256"), ("--max-headers", "10000")] {
        assert!(Config::try_parse_from(["corral", flag, value]).is_ok(), "{flag} {value}");
    }
    for mode in ["0", "400", "444", "500"] {
        let refused = Config::try_parse_from(["corral", "--socket-mode", mode]).unwrap_err();
        assert!(refused.to_string().contains("lets no one write the socket"), "{mode}");
        let error = resolve_with(&format!("socket_mode = \"{mode}\"\n"), &[], &[]).unwrap_err();
        assert_eq!(error.key, "socket_mode");
    }
    assert!(Config::try_parse_from(["corral", "--socket-mode", "060"]).is_ok(), "group only");
}
