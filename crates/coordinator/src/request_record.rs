//! A reconfiguration request as people and programs read it: a sentence for progress lines, the
//! report and the HTTP API's `detail` (`rescale aggregate to 4 tasks`), and a flat JSON object
//! for the metrics database's `detail` column and the API's `request` field
//! (`{"type": "rescale", "operator": "aggregate", "parallelism": 4}`).

use koala_protocol::ReconfigRequest;
use serde_json::{Value, json};

/// The request in one sentence.
pub fn describe(request: &ReconfigRequest) -> String {
    match request {
        ReconfigRequest::Rescale { operator, parallelism } => {
            format!("rescale {operator} to {parallelism} task{}", plural(*parallelism as usize))
        }
        ReconfigRequest::Rebalance { operator, moves } => {
            let moves: Vec<String> = moves
                .iter()
                .map(|(buckets, to)| {
                    format!("bucket{} {} to task {to}", plural(buckets.len()), ranges(buckets))
                })
                .collect();
            format!("rebalance {operator}: {}", moves.join("; "))
        }
        ReconfigRequest::Migrate { operator, task, worker } => {
            format!("migrate {operator}.{task} to worker{worker}")
        }
    }
}

/// The request as a flat JSON object (what the metrics database stores as `detail`).
pub fn to_json(request: &ReconfigRequest) -> Value {
    match request {
        ReconfigRequest::Rescale { operator, parallelism } => {
            json!({ "type": "rescale", "operator": operator, "parallelism": parallelism })
        }
        ReconfigRequest::Rebalance { operator, moves } => {
            let moves: Vec<Value> =
                moves.iter().map(|(buckets, to)| json!({ "buckets": buckets, "to": to })).collect();
            json!({ "type": "rebalance", "operator": operator, "moves": moves })
        }
        ReconfigRequest::Migrate { operator, task, worker } => {
            json!({ "type": "migrate", "operator": operator, "task": task, "worker": worker })
        }
    }
}

/// A request read back from [`to_json`]'s text; `None` for anything else (a database written
/// before the column held JSON).
pub fn from_text(text: &str) -> Option<ReconfigRequest> {
    let v: Value = serde_json::from_str(text).ok()?;
    let operator = v["operator"].as_str()?.to_string();
    let u32_of = |field: &str| v[field].as_u64().and_then(|n| u32::try_from(n).ok());
    Some(match v["type"].as_str()? {
        "rescale" => ReconfigRequest::Rescale { operator, parallelism: u32_of("parallelism")? },
        "migrate" => ReconfigRequest::Migrate { operator, task: u32_of("task")?, worker: u32_of("worker")? },
        "rebalance" => {
            let moves = v["moves"]
                .as_array()?
                .iter()
                .map(|m| {
                    let buckets = m["buckets"]
                        .as_array()?
                        .iter()
                        .map(|b| b.as_u64().and_then(|b| u16::try_from(b).ok()))
                        .collect::<Option<Vec<_>>>()?;
                    Some((buckets, u32::try_from(m["to"].as_u64()?).ok()?))
                })
                .collect::<Option<Vec<_>>>()?;
            ReconfigRequest::Rebalance { operator, moves }
        }
        _ => return None,
    })
}

/// The sentence for a stored `detail`: described if it is a request's JSON, else as stored.
pub fn describe_text(text: &str) -> String {
    from_text(text).map_or_else(|| text.to_string(), |r| describe(&r))
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Buckets as ranges: `0–31, 100–107, 120`.
fn ranges(buckets: &[u16]) -> String {
    let mut sorted = buckets.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        out.push(if start == end { start.to_string() } else { format!("{start}–{end}") });
        i += 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_as_sentences_and_round_trip_through_their_json() {
        let requests = [
            ReconfigRequest::Rescale { operator: "aggregate".into(), parallelism: 4 },
            ReconfigRequest::Rebalance {
                operator: "aggregate".into(),
                moves: vec![((0..32).collect(), 1), (vec![100, 101, 102, 107], 0)],
            },
            ReconfigRequest::Migrate { operator: "window".into(), task: 0, worker: 1 },
        ];
        let sentences: Vec<String> = requests.iter().map(describe).collect();
        assert_eq!(
            sentences,
            [
                "rescale aggregate to 4 tasks",
                "rebalance aggregate: buckets 0–31 to task 1; buckets 100–102, 107 to task 0",
                "migrate window.0 to worker1",
            ]
        );
        for (r, sentence) in requests.iter().zip(&sentences) {
            let text = to_json(r).to_string();
            assert!(!text.contains("Rescale {") && !text.contains("Some("), "{text}");
            assert_eq!(from_text(&text).as_ref(), Some(r), "{text}");
            assert_eq!(&describe_text(&text), sentence);
        }
        // A database written before the column held JSON: shown as stored.
        assert_eq!(describe_text("4→8"), "4→8");
    }
}
