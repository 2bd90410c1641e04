//! One run of an experiment as a job config: the query and its parameters, the tasks, the
//! reconfiguration schedule, the offered rate in steps and the capacity emulation. Every
//! experiment describes its runs with a [`Scenario`]; the engine ([`super::engine`]) gives each
//! the protocol, the output directory and the warm state, and writes the config `koala run`
//! reads ([`Scenario::config`]).

use std::fmt::Write as _;
use std::path::Path;

/// `[runtime] channel_capacity` of every experiment run: 16 batches of 256 records, about
/// 200 KB of keyed-aggregate records in flight per channel, as the authors' artifact buffers
/// (`BufferSize` 50 slots of `BatchSize` 4 KiB; Flink's network buffers hold less). The runtime's
/// default (64) holds four times that, and a marker waits behind all of it: stop-and-restart
/// waits once, DRRS once per subscale (seven in the full scale-out; measured there, 144.5 →
/// 136.1 s with this and the sliced link, stop-and-restart's pause unchanged).
pub const CHANNEL_CAPACITY: usize = 16;

/// A reconfiguration of the schedule.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Rescale `operator` to `tasks` tasks at `at_s`.
    Rescale { at_s: f64, operator: String, tasks: u32 },
    /// Move `buckets` of `operator` to task `to` (one entry per destination) at `at_s`.
    Rebalance { at_s: f64, operator: String, moves: Vec<(Vec<u16>, u32)> },
    /// Move task `task` of `operator` to worker `worker` at `at_s`.
    Migrate { at_s: f64, operator: String, task: u32, worker: u32 },
}

impl Step {
    /// One line for the settings: what happens when.
    pub fn describe(&self) -> String {
        match self {
            Step::Rescale { at_s, operator, tasks } => format!("{operator} → {tasks} tasks at {at_s} s"),
            Step::Rebalance { at_s, operator, moves } => format!(
                "rebalance of {operator} at {at_s} s: {}",
                moves
                    .iter()
                    .map(|(b, to)| format!("{} buckets → task {to}", b.len()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Step::Migrate { at_s, operator, task, worker } => {
                format!("{operator}.{task} → worker {worker} at {at_s} s")
            }
        }
    }
}

/// Everything of one run but its protocol, output directory and warm state.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The registered query.
    pub query: &'static str,
    /// `key = value` lines of `[params]` (before its tables).
    pub params: String,
    /// Tables under `[params]` (`[params.generator]` …) but `[params.source]`, as TOML text.
    pub param_tables: String,
    /// `[params.source]` lines besides `rate`.
    pub source: String,
    /// Tasks per operator at the start.
    pub parallelism: Vec<(&'static str, u32)>,
    /// The stateful operator the experiment reconfigures (plots of its tasks, its warm state).
    pub target: &'static str,
    /// Worker processes.
    pub workers: u32,
    /// Seconds the sources run.
    pub duration_s: u64,
    /// The reconfigurations, in order.
    pub steps: Vec<Step>,
    /// Offered rate: (second it starts at, records/s over all sources).
    pub rates: Vec<(f64, f64)>,
    /// `[runtime] task_records_per_sec`.
    pub task_records_per_sec: f64,
    /// `[runtime] link_mb_per_sec`.
    pub link_mb_per_sec: Option<f64>,
    /// Koala's `extra_keys` (progressive migration), if not the default.
    pub extra_keys: Option<usize>,
    /// Warm keys of the query's stateful operators (`koala warmup`), 0 = none.
    pub warm_keys: u64,
    /// Bytes of padding per warm value.
    pub value_bytes: usize,
}

impl Scenario {
    /// The job config of this scenario under `protocol` (a `--protocols` name; `drrs-overlapping`
    /// is DRRS with the original DRRS's schedule), writing into `out`, loading `warm` if given.
    pub fn config(&self, protocol: &str, out: &Path, warm: Option<&Path>) -> String {
        let (protocol, extra) = match protocol {
            "drrs-overlapping" => ("drrs", "\n[drrs]\nschedule = \"overlapping\"\n"),
            // The Remote baseline keeps its state on a state server, with a client cache per
            // task (the shared settings give it the others' cache size) holding the working set.
            "remote" => ("remote", "\n[state]\nbackend = \"remote\"\n"),
            p => (p, ""),
        };
        let mut text = format!(
            "query = \"{}\"\nworkers = {}\nduration_s = {}\noutput_dir = {:?}\nprotocol = \"{protocol}\"\n",
            self.query,
            self.workers,
            self.duration_s,
            out.display().to_string()
        );
        if let Some(warm) = warm {
            let _ = writeln!(text, "warm_state = {:?}", warm.display().to_string());
        }
        if let Some(n) = self.extra_keys {
            let _ = writeln!(text, "extra_keys = {n}");
        }
        text.push_str("\n[parallelism]\n");
        for (op, n) in &self.parallelism {
            let _ = writeln!(text, "{op} = {n}");
        }
        for step in &self.steps {
            text.push_str("\n[[reconfigurations]]\n");
            match step {
                Step::Rescale { at_s, operator, tasks } => {
                    let _ =
                        write!(text, "at_s = {at_s:?}\noperator = \"{operator}\"\nparallelism = {tasks}\n");
                }
                Step::Rebalance { at_s, operator, moves } => {
                    let moves: Vec<String> = moves
                        .iter()
                        .map(|(buckets, to)| format!("{{ buckets = {buckets:?}, to = {to} }}"))
                        .collect();
                    let _ = write!(
                        text,
                        "at_s = {at_s:?}\noperator = \"{operator}\"\nmoves = [{}]\n",
                        moves.join(", ")
                    );
                }
                Step::Migrate { at_s, operator, task, worker } => {
                    let _ = write!(
                        text,
                        "at_s = {at_s:?}\noperator = \"{operator}\"\ntask = {task}\nworker = {worker}\n"
                    );
                }
            }
        }
        let _ = write!(
            text,
            "\n[runtime]\ntask_records_per_sec = {:?}\nchannel_capacity = {CHANNEL_CAPACITY}\nreconfiguration_timeout_s = 600.0\n",
            self.task_records_per_sec
        );
        if let Some(link) = self.link_mb_per_sec {
            let _ = writeln!(text, "link_mb_per_sec = {link:?}");
        }
        text.push_str(extra);
        let rates: Vec<String> = self
            .rates
            .iter()
            .map(|(at, r)| {
                format!("{{ at_ms = {}, records_per_sec = {r:.1} }}", (at * 1000.0).round() as u64)
            })
            .collect();
        let _ = write!(
            text,
            "\n[params]\n{}\n{}\n[params.source]\n{}rate = [{}]\n",
            self.params_text().trim_end(),
            self.param_tables.trim_end(),
            self.source,
            rates.join(", ")
        );
        text
    }

    /// The `[params]` lines: [`Self::params`], and with warm state `state_padding_bytes` set to
    /// the warm values' [`Self::value_bytes`] (whatever `params` says). Every warm query's
    /// operators pad a key's state to `state_padding_bytes` on each update, so any other value
    /// would shrink or grow every warm key the run touches (the Taxi runs had none: 0 against
    /// 2 048 warm bytes), and the state a protocol moves would not be the warm state's.
    pub fn params_text(&self) -> String {
        let mut text: String = self
            .params
            .lines()
            .filter(|l| self.warm_keys == 0 || !l.trim_start().starts_with("state_padding_bytes"))
            .map(|l| format!("{l}\n"))
            .collect();
        if self.warm_keys > 0 {
            let _ = writeln!(text, "state_padding_bytes = {}", self.value_bytes);
        }
        text
    }

    /// The offered rate schedule as one line.
    pub fn rates_line(&self) -> String {
        self.rates.iter().map(|(at, r)| format!("{r:.0}/s from {at} s")).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario() -> Scenario {
        Scenario {
            query: "keyed-aggregate",
            params: "sink = \"discard\"".into(),
            param_tables: "[params.generator]\nkey_space = 100\n".into(),
            source: "max_disorder_ms = 50\n".into(),
            parallelism: vec![("source", 2), ("aggregate", 2), ("sink", 1)],
            target: "aggregate",
            workers: 3,
            duration_s: 30,
            steps: vec![
                Step::Rescale { at_s: 10.0, operator: "aggregate".into(), tasks: 4 },
                Step::Rebalance { at_s: 15.0, operator: "aggregate".into(), moves: vec![(vec![1, 2], 3)] },
                Step::Migrate { at_s: 20.0, operator: "aggregate".into(), task: 0, worker: 2 },
            ],
            rates: vec![(0.0, 1000.0), (5.0, 2000.0)],
            task_records_per_sec: 500.0,
            link_mb_per_sec: Some(1.5),
            extra_keys: Some(25),
            warm_keys: 100,
            value_bytes: 8,
        }
    }

    #[test]
    fn every_protocol_s_config_parses_with_the_scenario_s_settings() {
        let s = scenario();
        for protocol in ["koala", "stop-and-restart", "remote", "drrs", "drrs-overlapping"] {
            let text = s.config(protocol, Path::new("/tmp/x"), Some(Path::new("/tmp/warm")));
            let config = koala_coordinator::JobConfig::parse(&text, "test").expect(&text);
            assert_eq!(config.workers, 3);
            assert_eq!(config.duration_s, Some(30));
            assert_eq!(config.extra_keys, 25);
            assert_eq!(config.reconfigurations.len(), 3, "{text}");
            assert_eq!(config.runtime.task_records_per_sec, Some(500.0));
            assert_eq!(config.runtime.channel_capacity, CHANNEL_CAPACITY);
            assert_eq!(config.runtime.link_mb_per_sec, Some(1.5));
            assert_eq!(config.protocol_label(), protocol, "{text}");
            assert!(text.contains("records_per_sec = 2000.0"), "{text}");
        }
    }

    fn padding(text: &str) -> Option<i64> {
        let config = koala_coordinator::JobConfig::parse(text, "test").expect(text);
        config.params.get("state_padding_bytes").and_then(toml::Value::as_integer)
    }

    /// With warm state, the query pads a key to the warm values' size, whatever `params` says;
    /// without, `params` stands.
    #[test]
    fn a_warm_run_pads_state_as_its_warm_values() {
        let s = Scenario { params: "sink = \"discard\"\nstate_padding_bytes = 4096\n".into(), ..scenario() };
        let text = s.config("koala", Path::new("/tmp/x"), None);
        assert_eq!(padding(&text), Some(8), "{text}");
        assert_eq!(text.matches("state_padding_bytes").count(), 1, "{text}");
        let cold = Scenario { warm_keys: 0, ..s.clone() };
        assert_eq!(padding(&cold.config("koala", Path::new("/tmp/x"), None)), Some(4096));
        let plain = Scenario { params: "sink = \"discard\"".into(), ..s };
        assert_eq!(padding(&plain.config("koala", Path::new("/tmp/x"), None)), Some(8));
    }

    /// Every experiment's warm runs, in every mode: the query's padding is the warm values'
    /// (the Taxi runs of `scale-out-queries` and `rebalance`, `repeated --smoke` and
    /// `migration --smoke` had another, so a touched key changed size before it moved).
    #[test]
    fn every_warm_run_of_every_experiment_keeps_its_keys_size() {
        use crate::experiment::{EXPERIMENTS, Mode, Runner};
        let mut warm_runs = 0;
        for info in EXPERIMENTS {
            let Runner::Jobs(plan) = info.runner else { continue };
            let protocols: Vec<String> = info.protocols.iter().map(|p| p.to_string()).collect();
            for mode in [Mode::Smoke, Mode::Quick, Mode::Full] {
                let plan = plan(mode, &protocols).expect("plans");
                for run in plan.runs.iter().filter(|r| r.scenario.warm_keys > 0) {
                    let text = run.scenario.config(&run.protocol, Path::new("/tmp/x"), None);
                    let want = i64::try_from(run.scenario.value_bytes).ok();
                    assert_eq!(padding(&text), want, "{} {mode:?} {}", info.name, run.label);
                    warm_runs += 1;
                }
            }
        }
        assert!(warm_runs > 50, "{warm_runs} warm runs");
    }
}
