//! A strict parser of the Prometheus text exposition format (0.0.4), enough to reject what a
//! Prometheus server would: every sample's name declared by a `# TYPE` line before it, one TYPE
//! per name, the samples of a name together, valid metric and label names, quoted and escaped
//! label values, no duplicate label sets, and values that parse as floats.

use std::collections::{BTreeMap, BTreeSet};

/// One sample: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

fn valid_name(name: &str, colon: bool) -> bool {
    let mut chars = name.chars();
    let first_ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
    chars.next().is_some_and(first_ok) && chars.all(|c| first_ok(c) || c.is_ascii_digit())
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        t => t.parse().map_err(|_| format!("value {t:?} is not a float")),
    }
}

/// Label set `{a="x",b="y"}` → map, and the rest of the line after `}`.
fn parse_labels(text: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = text.strip_prefix('{').ok_or("labels must start with {")?;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let (name, after) = rest.split_once("=\"").ok_or_else(|| format!("label without =\": {rest:?}"))?;
        if !valid_name(name, false) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape {other:?} in label {name}")),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => return Err(format!("unterminated value of label {name}")),
            }
        };
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} given twice"));
        }
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// Parses the whole text: (TYPE per name, samples in order).
pub fn parse(text: &str) -> Result<(BTreeMap<String, String>, Vec<Sample>), String> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = Vec::new();
    let mut finished: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut seen: BTreeSet<(String, Vec<(String, String)>)> = BTreeSet::new();
    if !text.ends_with('\n') {
        return Err("the text must end with a newline".into());
    }
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(|| at("TYPE without a type".into()))?;
            if !["counter", "gauge", "summary", "histogram", "untyped"].contains(&kind) {
                return Err(at(format!("unknown type {kind:?}")));
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(at(format!("second TYPE for {name}")));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !valid_name(name, true) {
                return Err(at("HELP of a bad name".into()));
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("sample without a value".into()))?;
        let name = &line[..name_end];
        if !valid_name(name, true) {
            return Err(at(format!("bad metric name {name:?}")));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(at)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let mut fields = rest.split_whitespace();
        let value = parse_value(fields.next().ok_or_else(|| at("no value".into()))?).map_err(at)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|_| at(format!("timestamp {ts:?} is not an integer")))?;
        }
        if fields.next().is_some() {
            return Err(at("extra fields after the value".into()));
        }
        let kind = types.get(name).ok_or_else(|| at(format!("{name} has no TYPE before it")))?;
        if kind == "counter" && !name.ends_with("_total") {
            return Err(at(format!("counter {name} does not end in _total")));
        }
        if current.as_deref() != Some(name) {
            if finished.contains(name) {
                return Err(at(format!("samples of {name} are not together")));
            }
            if let Some(previous) = current.replace(name.to_string()) {
                finished.insert(previous);
            }
        }
        let key = (name.to_string(), labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
        if !seen.insert(key) {
            return Err(at("duplicate label set".into()));
        }
        samples.push(Sample { name: name.to_string(), labels, value });
    }
    Ok((types, samples))
}

#[test]
fn the_parser_rejects_what_prometheus_rejects() {
    let good = "# HELP a_total x\n# TYPE a_total counter\na_total{task=\"s.0\",q=\"a\\\"b\"} 1.5\n";
    let (_, samples) = parse(good).expect("valid");
    assert_eq!(samples[0].labels["q"], "a\"b");
    for bad in [
        "a_total 1\n",
        "# TYPE a_total counter\na_total{task=\"x} 1\n",
        "# TYPE a counter\na 1\n",
        "# TYPE a gauge\n# TYPE b gauge\na 1\nb 1\na{x=\"1\"} 2\n",
        "# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n",
        "# TYPE a gauge\na one\n",
        "# TYPE a gauge\na 1",
    ] {
        assert!(parse(bad).is_err(), "accepted {bad:?}");
    }
}
