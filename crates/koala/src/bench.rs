//! `koala bench`: the keyed running aggregate at full speed on 2 workers, and with
//! `--checkpoint-interval-ms` the cost of checkpoints, with `--tls` the cost of TLS between the
//! processes, each measured in the same invocation.

use std::path::{Path, PathBuf};

use anyhow::Context;
use koala_coordinator::JobConfig;

use crate::human::human_bytes;
use crate::launch::run_job_locally;

/// `koala bench`'s flags.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Distinct keys, drawn uniformly (or from the active window, see --active-keys).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Records to push through (more = longer steady state).
    #[arg(long, default_value_t = 10_000_000)]
    pub records: u64,
    /// State store: fjall, memory, or none (no state: the ceiling of the same pipeline).
    #[arg(long, default_value = "fjall")]
    pub backend: String,
    /// Write-back cache per aggregate task in front of fjall, MiB (0 = none; fjall only).
    /// Default: each task's share of its worker's memory budget, as `koala run`.
    #[arg(long)]
    pub cache_mb: Option<u64>,
    /// Tasks of the source and of the aggregation.
    #[arg(long, default_value_t = 2)]
    pub parallelism: u32,
    /// Temporal locality: records draw from a window of this many consecutive keys that
    /// moves forward one key every --active-shift records (0 = all keys active).
    #[arg(long, default_value_t = 0)]
    pub active_keys: u64,
    /// Records per one-key move of the active window (1, the demo's, gives each key about
    /// one record while it is active; 10 about ten).
    #[arg(long, default_value_t = 1)]
    pub active_shift: u64,
    /// Aligned checkpoints every this many ms (off by default; every protocol). The bench
    /// then runs twice, without and with checkpoints, and prints both throughputs, their
    /// ratio, and the checkpoints' duration, size and alignment time.
    #[arg(long)]
    pub checkpoint_interval_ms: Option<u64>,
    /// The job's reconfiguration protocol (default: koala); the bench reconfigures nothing,
    /// but each protocol has its own stateful task loop.
    #[arg(long)]
    pub protocol: Option<String>,
    /// Start from warm state: every key of --keys holds an entry padded so all of them
    /// take about this many MiB (written once into <output-dir>/warm; 0 = start empty)
    #[arg(long, default_value_t = 0)]
    pub warm_mb: u64,
    /// Measure TLS: the bench runs twice, over plain TCP and over TLS between the workers (a
    /// throwaway CA and certificate in <output-dir>/tls), and prints both throughputs and
    /// their ratio.
    #[arg(long, conflicts_with = "checkpoint_interval_ms")]
    pub tls: bool,
    /// Where metrics and worker state go.
    #[arg(long, default_value = "koala-out/bench")]
    pub output_dir: PathBuf,
}

impl BenchArgs {
    /// Runs the bench these flags describe.
    pub fn run(self) -> anyhow::Result<BenchResult> {
        let spec = BenchSpec {
            keys: self.keys,
            records: self.records,
            backend: self.backend,
            cache_mb: self.cache_mb,
            parallelism: self.parallelism,
            active_keys: self.active_keys,
            active_shift: self.active_shift,
            checkpoint_interval_ms: self.checkpoint_interval_ms,
            protocol: self.protocol,
            warm_mb: self.warm_mb,
            tls: None,
        };
        bench(&spec, self.tls, &self.output_dir)
    }
}

/// What `koala bench` runs.
#[derive(Clone, Debug)]
pub struct BenchSpec {
    /// Distinct keys.
    pub keys: u64,
    /// Records over all source tasks.
    pub records: u64,
    /// `fjall`, `memory` or `none`.
    pub backend: String,
    /// `[state] cache_mb` (fjall only); `None` = the default.
    pub cache_mb: Option<u64>,
    /// Tasks of the source and of the aggregate.
    pub parallelism: u32,
    /// Size of the sliding window of active keys (0 = uniform over all keys).
    pub active_keys: u64,
    /// Records per one-key move of the window.
    pub active_shift: u64,
    /// Aligned checkpoints every this many ms (`None`: off).
    pub checkpoint_interval_ms: Option<u64>,
    /// The job's `protocol` (`None`: the default, koala); no reconfiguration runs in the bench,
    /// but the stateful task loop is the protocol's.
    pub protocol: Option<String>,
    /// Warm state the aggregate starts with: every key's entry padded so the keys hold about
    /// this many MiB (0: none, the state grows from empty).
    pub warm_mb: u64,
    /// TLS files for every process of the run (`None`: plain TCP).
    pub tls: Option<koala_types::tls::TlsFiles>,
}

/// Warm state written for a bench: its directory and each entry's padding.
#[derive(Clone, Debug)]
pub struct Warm {
    /// The `warm_state` directory.
    pub dir: std::path::PathBuf,
    /// `state_padding_bytes`: each value's padding.
    pub value_bytes: usize,
}

/// Bytes a keyed-aggregate entry holds besides its padding (key, count, encoding), about.
const ENTRY_BYTES: u64 = 24;

impl BenchSpec {
    /// Writes the warm state of `--warm-mb` into `<output_dir>/warm` (once per size and key
    /// count), or `None` without it.
    pub fn warm(&self, output_dir: &Path) -> anyhow::Result<Option<Warm>> {
        if self.warm_mb == 0 {
            return Ok(None);
        }
        anyhow::ensure!(self.keys > 0, "--keys 0: warm state needs keys");
        let value_bytes = ((self.warm_mb << 20) / self.keys).saturating_sub(ENTRY_BYTES) as usize;
        let dir = output_dir.join("warm").join(format!("{}-keys-{value_bytes}-B", self.keys));
        let params = format!("state_padding_bytes = {value_bytes}\n");
        if !dir.join("aggregate").join("manifest").exists() {
            if dir.exists() {
                std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
            }
            let started = std::time::Instant::now();
            let written = crate::warmup::warmup(
                "keyed-aggregate",
                &params,
                koala_types::DEFAULT_NUM_BUCKETS,
                self.keys,
                value_bytes,
                &dir,
            )?;
            println!(
                "warm state: {} keys, {} in {:.1} s ({})",
                self.keys,
                human_bytes(written.iter().map(|w| w.bytes).sum()),
                started.elapsed().as_secs_f64(),
                dir.display()
            );
        }
        Ok(Some(Warm { dir, value_bytes }))
    }
}

impl BenchSpec {
    /// The job config of the run.
    pub fn config_text(&self, output_dir: &Path, warm: Option<&Warm>) -> String {
        let (warm_state, padding) = match warm {
            Some(w) => (
                format!("warm_state = {:?}\n", w.dir.display().to_string()),
                format!("state_padding_bytes = {}\n", w.value_bytes),
            ),
            None => (String::new(), String::new()),
        };
        let cache = self.cache_mb.map(|mb| format!("cache_mb = {mb}\n")).unwrap_or_default();
        let active = if self.active_keys > 0 {
            format!("active_keys = {}\nactive_shift_records = {}\n", self.active_keys, self.active_shift)
        } else {
            String::new()
        };
        let checkpoints = self
            .checkpoint_interval_ms
            .map(|ms| format!("checkpoint_interval_ms = {ms}\n"))
            .into_iter()
            .chain(self.protocol.as_ref().map(|p| format!("protocol = {p:?}\n")))
            .collect::<String>();
        format!(
            "query = \"keyed-aggregate\"\nworkers = 2\noutput_dir = {:?}\n{warm_state}{checkpoints}\
             [state]\nbackend = {:?}\n{cache}\
             [parallelism]\nsource = {p}\naggregate = {p}\nsink = 1\n\
             [params]\nsink = \"discard\"\n{padding}[params.generator]\nkey_space = {}\nrecords = {}\n{active}",
            output_dir.display().to_string(),
            self.backend,
            self.keys,
            self.records,
            p = self.parallelism,
        )
    }
}

/// The numbers `koala bench` prints, from the per-second table of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchResult {
    /// Steady seconds: every full second but the first and the last.
    pub steady_seconds: usize,
    /// Mean records/s over the steady seconds.
    pub steady: f64,
    /// Mean records/s over the first and the last 10 % of the steady seconds (at least one).
    pub first_tenth: f64,
    /// See `first_tenth`.
    pub last_tenth: f64,
    /// Per-batch latency: median over steady seconds of the worst task's p99, µs.
    pub batch_p99_us: f64,
    /// Per-batch latency: mean over steady seconds of the mean, µs.
    pub batch_mean_us: f64,
}

/// Steady-state numbers of a run's per-second rows (`None` if there is no steady second).
pub fn bench_result(rows: &[koala_coordinator::report::SecondRow]) -> Option<BenchResult> {
    let steady = rows.get(1..rows.len().saturating_sub(1))?;
    if steady.is_empty() {
        return None;
    }
    let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    let throughput: Vec<f64> = steady.iter().map(|r| r.throughput).collect();
    let tenth = steady.len().div_ceil(10);
    let mut p99: Vec<f64> = steady.iter().filter_map(|r| r.batch_latency_p99_us).collect();
    p99.sort_by(f64::total_cmp);
    let means: Vec<f64> = steady.iter().filter_map(|r| r.batch_latency_mean_us).collect();
    Some(BenchResult {
        steady_seconds: steady.len(),
        steady: mean(&throughput),
        first_tenth: mean(&throughput[..tenth]),
        last_tenth: mean(&throughput[throughput.len() - tenth..]),
        batch_p99_us: p99.get(p99.len() / 2).copied().unwrap_or(f64::NAN),
        batch_mean_us: mean(&means),
    })
}

/// `koala bench`: the keyed running aggregate at full speed on 2 workers. With
/// `checkpoint_interval_ms` it runs twice in one invocation — first without checkpoints (into
/// `<output_dir>/no-checkpoints`), then with them (`<output_dir>/checkpoints`) — and prints both
/// and their ratio; it returns the run with checkpoints.
pub fn bench(spec: &BenchSpec, tls: bool, output_dir: &Path) -> anyhow::Result<BenchResult> {
    if tls {
        return bench_tls(spec, output_dir);
    }
    let Some(ms) = spec.checkpoint_interval_ms else {
        let warm = spec.warm(output_dir)?;
        return bench_once(spec, output_dir, warm.as_ref()).map(|(result, _)| result);
    };
    let off = BenchSpec { checkpoint_interval_ms: None, ..spec.clone() };
    println!("run 1 of 2: without checkpoints");
    let warm = spec.warm(output_dir)?;
    let (without, _) = bench_once(&off, &output_dir.join("no-checkpoints"), warm.as_ref())?;
    println!();
    println!("run 2 of 2: aligned checkpoints every {ms} ms");
    let (with, report) = bench_once(spec, &output_dir.join("checkpoints"), warm.as_ref())?;
    let c = &report.checkpoints;
    let (d_mean, d_max) = c.duration_ms();
    let (b_mean, b_max) = c.bytes();
    let (w_mean, w_max) = c.written_bytes();
    let (a_mean, a_max) = c.alignment_ms();
    println!();
    println!("checkpoint cost, both runs in this invocation (same machine, back to back)");
    println!("{:<44} {:>12}", "metric", "value");
    println!("{:<44} {:>12.0}", "records/s steady, without checkpoints", without.steady);
    println!("{:<44} {:>12.0}", format!("records/s steady, checkpoints every {ms} ms"), with.steady);
    println!("{:<44} {:>11.1} %", "with / without", 100.0 * with.steady / without.steady);
    println!("{:<44} {:>12}", "checkpoints completed", c.checkpoints.len());
    println!("{:<44} {:>12}", "checkpoint duration mean / max (ms)", format!("{d_mean} / {d_max}"));
    println!("{:<44} {:>12}", "checkpoint size mean", human_bytes(b_mean));
    println!("{:<44} {:>12}", "checkpoint size max", human_bytes(b_max));
    println!(
        "{:<44} {:>12}",
        "written anew mean / max",
        format!("{} / {}", human_bytes(w_mean), human_bytes(w_max))
    );
    println!("{:<44} {:>12}", "checkpoints skipped (one still running)", c.skipped);
    println!("{:<44} {:>12}", "alignment mean / max (ms)", format!("{a_mean} / {a_max}"));
    Ok(with)
}

/// `koala bench --tls`: the run over plain TCP (`<output_dir>/plain`), then over TLS
/// (`<output_dir>/tls`, certificates from a throwaway CA in `<output_dir>/tls-certs`); prints
/// both and their ratio and returns the TLS run.
fn bench_tls(spec: &BenchSpec, output_dir: &Path) -> anyhow::Result<BenchResult> {
    println!("run 1 of 2: plain TCP");
    let warm = spec.warm(output_dir)?;
    let (plain, _) =
        bench_once(&BenchSpec { tls: None, ..spec.clone() }, &output_dir.join("plain"), warm.as_ref())?;
    let files = crate::tls_setup::throwaway(&output_dir.join("tls-certs"))?;
    println!();
    println!("run 2 of 2: TLS between every process (TLS 1.3, ring, ECDSA P-256 certificates)");
    let (tls, _) =
        bench_once(&BenchSpec { tls: Some(files), ..spec.clone() }, &output_dir.join("tls"), warm.as_ref())?;
    println!();
    println!("TLS cost, both runs in this invocation (same machine, back to back)");
    println!("{:<44} {:>12}", "metric", "value");
    println!("{:<44} {:>12.0}", "records/s steady, plain TCP", plain.steady);
    println!("{:<44} {:>12.0}", "records/s steady, TLS", tls.steady);
    println!("{:<44} {:>11.1} %", "TLS / plain", 100.0 * tls.steady / plain.steady);
    println!("{:<44} {:>12.0}", "per-batch latency p99 (µs), plain", plain.batch_p99_us);
    println!("{:<44} {:>12.0}", "per-batch latency p99 (µs), TLS", tls.batch_p99_us);
    Ok(tls)
}

/// One bench run into `output_dir`: its numbers, printed, and its report.
fn bench_once(
    spec: &BenchSpec,
    output_dir: &Path,
    warm: Option<&Warm>,
) -> anyhow::Result<(BenchResult, koala_coordinator::report::ReportSummary)> {
    let mut config = JobConfig::parse(&spec.config_text(output_dir, warm), "koala bench")
        .map_err(|e| anyhow::anyhow!("{e} (check --backend, --cache-mb and --protocol)"))?;
    config.tls = spec.tls.clone();
    let summary = run_job_locally(config)?;
    let report = koala_coordinator::report::report(&summary.metrics_db, Some(&summary.run), output_dir)?;
    let result = bench_result(&report.table.rows)
        .context("the run was too short for a steady state (it needs 3 seconds); raise --records")?;
    let cache = match (spec.backend.as_str(), spec.cache_mb) {
        ("fjall", Some(0)) => ", no cache".to_string(),
        ("fjall", Some(mb)) => format!(", cache {mb} MiB per task"),
        ("fjall", None) => ", cache from the worker memory budget (the memory line above)".to_string(),
        _ => String::new(),
    };
    let active = if spec.active_keys > 0 {
        format!(", active window {} keys sliding 1 key per {} records", spec.active_keys, spec.active_shift)
    } else {
        " uniform".to_string()
    };
    println!();
    println!(
        "keyed running aggregate: {} records over {} keys{active}; backend {}{cache}; {p} source + {p} aggregate tasks on 2 workers; {} steady seconds",
        spec.records,
        spec.keys,
        spec.backend,
        result.steady_seconds,
        p = spec.parallelism,
    );
    println!("{:<44} {:>12}", "metric", "value");
    println!("{:<44} {:>12.0}", "records/s, steady (mean of steady seconds)", result.steady);
    println!("{:<44} {:>12.0}", "records/s, first 10 % of steady seconds", result.first_tenth);
    println!("{:<44} {:>12.0}", "records/s, last 10 % of steady seconds", result.last_tenth);
    println!("{:<44} {:>12.2}", "last / first", result.last_tenth / result.first_tenth);
    println!("{:<44} {:>12.0}", "per-batch latency p99 (µs, median second)", result.batch_p99_us);
    println!("{:<44} {:>12.0}", "per-batch latency mean (µs)", result.batch_mean_us);
    if let Some(ms) = spec.checkpoint_interval_ms {
        let n = summary.checkpoints.len();
        let mean = summary.checkpoints.iter().map(|c| c.bytes).sum::<u64>() / (n.max(1) as u64);
        println!("{:<44} {:>12}", format!("checkpoints every {ms} ms, completed"), n);
        println!("{:<44} {:>12}", "checkpoint size, mean", human_bytes(mean));
    }
    Ok((result, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use koala_coordinator::report::SecondRow;

    fn second(t_s: i64, throughput: f64, p99: f64) -> SecondRow {
        SecondRow {
            t_s,
            throughput,
            output: throughput,
            batch_latency_mean_us: Some(p99 / 10.0),
            batch_latency_p99_us: Some(p99),
            batch_latency_max_us: Some(p99),
            ..SecondRow::default()
        }
    }

    #[test]
    fn bench_numbers_skip_the_partial_seconds_and_compare_the_first_and_last_tenth() {
        // 22 seconds: the first and the last are partial; 20 steady, so a tenth is 2 seconds.
        let rows: Vec<SecondRow> = (0..22)
            .map(|t| second(t, if t == 0 || t == 21 { 1.0 } else { 100.0 * t as f64 }, t as f64))
            .collect();
        let r = bench_result(&rows).expect("steady seconds");
        assert_eq!(r.steady_seconds, 20);
        assert_eq!(r.steady, 1050.0);
        assert_eq!((r.first_tenth, r.last_tenth), (150.0, 1950.0));
        assert_eq!(r.batch_p99_us, 11.0, "the median second's p99");
        assert!(bench_result(&rows[..2]).is_none(), "two partial seconds have no steady state");
    }

    #[test]
    fn bench_configs_parse_for_every_backend() {
        for (backend, cache_mb) in [("fjall", Some(0)), ("fjall", Some(8)), ("fjall", None), ("memory", None)]
        {
            let spec = BenchSpec {
                keys: 10,
                records: 100,
                backend: backend.into(),
                cache_mb,
                parallelism: 2,
                active_keys: 5,
                active_shift: 1,
                checkpoint_interval_ms: (backend == "memory").then_some(1000),
                protocol: (backend == "memory").then(|| "stop-and-restart".into()),
                warm_mb: 0,
                tls: None,
            };
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::create_dir_all(dir.path().join("aggregate")).expect("mkdir");
            std::fs::write(dir.path().join("aggregate/manifest"), "").expect("manifest");
            let warm = Warm { dir: dir.path().to_path_buf(), value_bytes: 100 };
            let warm_config = JobConfig::parse(&spec.config_text(Path::new("out"), Some(&warm)), "test");
            assert!(warm_config.is_ok_and(|c| c.params_text().contains("state_padding_bytes = 100")));
            let config = JobConfig::parse(&spec.config_text(Path::new("out"), None), "test").expect("parses");
            assert_eq!(config.state.backend.name(), backend);
            assert_eq!(config.checkpoint_interval_ms, spec.checkpoint_interval_ms);
            let options = config.state.options();
            assert_eq!(options.cache_bytes, cache_mb.unwrap_or(0) << 20);
            assert_eq!(options.cache_from_budget, backend == "fjall" && cache_mb.is_none());
        }
    }
}
