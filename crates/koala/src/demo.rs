//! The demo's job (`examples/demo.toml`) as `koala demo` and `koala compare` run it: its length
//! (`--duration-s`), its quick form (`--quick`: the same shape in half the time) and the line
//! that announces it, read off the config the run gets, so the header never promises a surge or
//! a scale-out the run does not have.

use koala_coordinator::JobConfig;
use koala_dataflow::RateSchedule;

/// The demo job's config, also shipped as `examples/demo.toml`.
pub const DEMO_CONFIG: &str = include_str!("../../../examples/demo.toml");

/// Seconds a demo runs without `--duration-s`.
pub const DEFAULT_DURATION_S: u64 = 60;

/// The demo's config for a run of `duration_s` seconds (the default length without it), with
/// every time in it (rate steps, reconfigurations, the default length) halved when `quick`. A run
/// shorter than its schedule is allowed (a smoke test); [`describe`] says what it leaves out.
pub fn config(duration_s: Option<u64>, quick: bool) -> anyhow::Result<JobConfig> {
    let mut config = JobConfig::parse(DEMO_CONFIG, "examples/demo.toml")?;
    if quick {
        let mut schedule = rate_schedule(&config);
        for step in &mut schedule.0 {
            step.at_ms /= 2;
        }
        let source = config
            .params
            .get_mut("source")
            .and_then(toml::Value::as_table_mut)
            .ok_or_else(|| anyhow::anyhow!("examples/demo.toml: [params.source] is missing"))?;
        source.insert("rate".into(), toml::Value::try_from(&schedule)?);
        for r in &mut config.reconfigurations {
            r.at_s /= 2.0;
        }
    }
    let default_s = if quick { DEFAULT_DURATION_S / 2 } else { DEFAULT_DURATION_S };
    let duration_s = duration_s.unwrap_or(default_s);
    config.duration_s = Some(duration_s);
    Ok(config)
}

fn rate_schedule(config: &JobConfig) -> RateSchedule {
    config
        .params
        .get("source")
        .and_then(|s| s.get("rate"))
        .and_then(|r| r.clone().try_into().ok())
        .unwrap_or_else(RateSchedule::unlimited)
}

/// What the run of `config` will do, in its own times: `rate 30 000/s, 60 000/s from 20 s,
/// 30 000/s from 45 s; aggregate scaled out 2 → 4 at 25 s; sources stop at 60 s`. Steps and
/// reconfigurations after the sources stop are left out.
pub fn describe(config: &JobConfig) -> String {
    let end_s = config.duration_s.map_or(f64::INFINITY, |d| d as f64);
    let rate = |r: f64| {
        if r <= 0.0 {
            "unlimited".to_string()
        } else {
            format!("{}/s", koala_coordinator::report::fmt_records(r))
        }
    };
    let steps: Vec<String> = rate_schedule(config)
        .0
        .iter()
        .filter(|s| (s.at_ms as f64 / 1000.0) < end_s)
        .map(|s| match s.at_ms {
            0 => format!("rate {}", rate(s.records_per_sec)),
            ms => format!("{} from {} s", rate(s.records_per_sec), ms as f64 / 1000.0),
        })
        .collect();
    let mut parts = vec![steps.join(", ")];
    let (during, after): (Vec<_>, Vec<_>) = config.reconfigurations.iter().partition(|r| r.at_s < end_s);
    for r in during {
        let before = config.parallelism.get(&r.operator).copied().unwrap_or(config.default_parallelism);
        let what = match r.parallelism {
            Some(p) if p > before => format!("scaled out {before} → {p}"),
            Some(p) => format!("scaled in {before} → {p}"),
            None => "reconfigured".to_string(),
        };
        parts.push(format!("{} {what} at {} s", r.operator, r.at_s));
    }
    if let Some(d) = config.duration_s {
        parts.push(format!("sources stop at {d} s"));
    }
    if let Some(first) = after.first() {
        parts.push(format!(
            "no reconfiguration at {} s: the run ends first (--duration-s above it runs one)",
            first.at_s
        ));
    }
    parts.join("; ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_header_says_what_the_run_does() {
        let full = config(None, false).unwrap();
        assert_eq!(
            describe(&full),
            "rate 30 000/s, 60 000/s from 20 s, 30 000/s from 45 s; aggregate scaled out 2 → 4 at 25 s; \
             sources stop at 60 s"
        );
        // A shorter run ends inside the surge: its header does not announce the drop at 45 s.
        let short = config(Some(35), false).unwrap();
        assert_eq!(
            describe(&short),
            "rate 30 000/s, 60 000/s from 20 s; aggregate scaled out 2 → 4 at 25 s; sources stop at 35 s"
        );
        // One shorter than the scale-out says it has none.
        assert_eq!(
            describe(&config(Some(4), false).unwrap()),
            "rate 30 000/s; sources stop at 4 s; no reconfiguration at 25 s: the run ends first \
             (--duration-s above it runs one)"
        );
    }

    #[test]
    fn quick_is_the_same_shape_in_half_the_time() {
        let quick = config(None, true).unwrap();
        assert_eq!(quick.duration_s, Some(30));
        assert_eq!(
            describe(&quick),
            "rate 30 000/s, 60 000/s from 10 s, 30 000/s from 22.5 s; aggregate scaled out 2 → 4 at 12.5 s; \
             sources stop at 30 s"
        );
    }
}
