//! The CSV replay source: a user with the real traces runs the same queries on them
//! (`input = "csv"`, `[params.csv] paths = [...]`). Each query reads its own columns, in order
//! (docs/workloads.md lists them; [`super::Workload::CSV_COLUMNS`]); fields are separated by
//! commas, may be double-quoted (`""` inside quotes is a quote), and surrounding spaces are
//! ignored. Source task `i` of `n` reads files `i, i + n, …` one after another; records keep
//! their file's order and the event time of their `time_ms` column.
//!
//! A row that does not parse stops the job with an error naming the file, the line, the column
//! and the fix — never a panic, never a skipped row.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;

use koala_dataflow::{Dataflow, DataflowError, SourceLogic, SourceOptions, SourcePoll, Stream, TaskInstance};
use koala_types::{Record, encode};

use super::Workload;
use super::queries::CsvParams;

/// Checks that there are files and that each can be opened, naming the first that cannot.
pub fn check_paths(csv: &CsvParams) -> Result<(), String> {
    if csv.paths.is_empty() {
        return Err("input = \"csv\" needs files: give [params.csv] paths = [\"trace-0.csv\", …]".into());
    }
    for (i, path) in csv.paths.iter().enumerate() {
        File::open(path).map_err(|e| format!("csv.paths[{i}] = {path:?}: cannot open it: {e}"))?;
    }
    Ok(())
}

/// The source `name` replaying `csv`'s files as workload `W`'s records.
pub fn source<W: Workload>(
    df: &Dataflow,
    name: &str,
    options: SourceOptions,
    csv: &CsvParams,
) -> Stream<W::Event> {
    let csv = csv.clone();
    let factory = Arc::new(move |task: TaskInstance| {
        let tasks = task.parallelism.max(1) as usize;
        let files = csv.paths.iter().skip(task.index as usize).step_by(tasks).map(PathBuf::from).collect();
        Box::new(CsvSource::<W>::new(files, csv.header)) as Box<dyn SourceLogic>
    });
    df.source_from(name, options, factory)
}

/// One task's files, read in turn.
pub struct CsvSource<W> {
    files: std::vec::IntoIter<PathBuf>,
    header: bool,
    current: Option<(PathBuf, BufReader<File>, u64)>,
    line: String,
    _workload: PhantomData<fn() -> W>,
}

impl<W: Workload> CsvSource<W> {
    /// Reads `files` in order; `header`: skip each file's first line.
    pub fn new(files: Vec<PathBuf>, header: bool) -> Self {
        Self { files: files.into_iter(), header, current: None, line: String::new(), _workload: PhantomData }
    }

    /// The next record, `None` after the last file.
    fn next_event(&mut self) -> Result<Option<W::Event>, DataflowError> {
        loop {
            if self.current.is_none() {
                let Some(path) = self.files.next() else { return Ok(None) };
                let file = File::open(&path).map_err(|e| {
                    DataflowError::Other(format!("csv file {}: cannot open it: {e}", path.display()))
                })?;
                self.current = Some((path, BufReader::new(file), 0));
            }
            let Some((path, reader, line_no)) = self.current.as_mut() else { continue };
            self.line.clear();
            let read = reader.read_line(&mut self.line).map_err(|e| {
                DataflowError::Other(format!(
                    "csv file {} line {}: read failed: {e}",
                    path.display(),
                    *line_no + 1
                ))
            })?;
            if read == 0 {
                self.current = None;
                continue;
            }
            *line_no += 1;
            let text = self.line.trim_end_matches(['\n', '\r']);
            if (*line_no == 1 && self.header) || text.trim().is_empty() {
                continue;
            }
            let at = |column: Option<usize>, what: String| {
                let col = column
                    .map(|c| format!(" column {} ({})", c + 1, W::CSV_COLUMNS.get(c).copied().unwrap_or("?")))
                    .unwrap_or_default();
                DataflowError::Other(format!(
                    "csv file {} line {line_no}{col}: {what}; {} rows have the columns {}",
                    path.display(),
                    W::NAME,
                    W::CSV_COLUMNS.join(",")
                ))
            };
            let fields = split(text).map_err(|(c, what)| at(Some(c), what))?;
            if fields.len() != W::CSV_COLUMNS.len() {
                return Err(at(None, format!("{} fields, expected {}", fields.len(), W::CSV_COLUMNS.len())));
            }
            let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
            return W::from_fields(&fields).map(Some).map_err(|(c, what)| at(Some(c), what));
        }
    }
}

impl<W: Workload> SourceLogic for CsvSource<W> {
    fn poll(&mut self, max: usize, out: &mut Vec<Record>) -> Result<SourcePoll, DataflowError> {
        for _ in 0..max {
            let Some(event) = self.next_event()? else { return Ok(SourcePoll::Finished) };
            out.push(Record { key: Vec::new(), value: encode(&event)?, time: W::time(&event), due_ms: 0 });
        }
        Ok(SourcePoll::More)
    }
}

/// Splits one CSV line into fields; an unterminated quote is an error at its field.
fn split(line: &str) -> Result<Vec<String>, (usize, String)> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        let field = fields.last_mut().expect("one field at least");
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.trim().is_empty() => {
                field.clear();
                quoted = true;
            }
            (false, ',') => fields.push(String::new()),
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err((fields.len() - 1, "a quote is not closed".into()));
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::realworld::{Azure, AzureReading, Borg, Twitch};

    fn read<W: Workload>(text: &str, header: bool) -> Result<Vec<W::Event>, String> {
        let dir = std::env::temp_dir().join(format!("koala-csv-{}-{}", std::process::id(), W::NAME));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let path = dir.join(format!("{}.csv", text.len()));
        File::create(&path).and_then(|mut f| f.write_all(text.as_bytes())).map_err(|e| e.to_string())?;
        let mut source = CsvSource::<W>::new(vec![path], header);
        let mut records = Vec::new();
        while source.poll(2, &mut records).map_err(|e| e.to_string())? == SourcePoll::More {}
        records.iter().map(|r| koala_types::decode(&r.value).map_err(|e| e.to_string())).collect()
    }

    #[test]
    fn rows_read_with_quotes_hashed_ids_and_a_header() {
        let text = "time_ms,vm,min,max,avg\n0, 7 ,1.5,90,\"20.25\"\n\n300000,\"vm \"\"a\"\"\",0,100,50\n";
        let rows = read::<Azure>(text, true).expect("reads");
        assert_eq!(rows[0], AzureReading { vm: 7, min_cpu: 150, max_cpu: 9_000, avg_cpu: 2_025, time: 0 });
        assert_eq!(rows[1].time, 300_000);
        assert_ne!(rows[1].vm, 0, "a text id is hashed");
        assert_eq!(rows.len(), 2);
    }

    #[test]
    fn a_bad_row_names_file_line_and_column() {
        let err = read::<Borg>("0,1,2,0.5,0.5,0.1\n5,1,2,0.5,lots,0.1\n", false).expect_err("bad ram");
        assert!(err.contains(".csv line 2 column 5 (ram)") && err.contains("\"lots\""), "{err}");
        let err = read::<Twitch>("0,1,2,60000,1\n", false).expect_err("short row");
        assert!(err.contains("line 1") && err.contains("5 fields, expected 6"), "{err}");
        let err = read::<Twitch>("0,1,2,60000,1,\"yes\n", false).expect_err("open quote");
        assert!(err.contains("column 6 (follow)") && err.contains("not closed"), "{err}");
        let err = read::<Twitch>("0,1,2,60000,1,maybe\n", false).expect_err("bad bool");
        assert!(err.contains("column 6 (follow)"), "{err}");
    }

    #[test]
    fn missing_files_are_named_before_the_job_starts() {
        let csv = CsvParams { paths: vec!["/no/such/trace.csv".into()], header: false };
        let err = check_paths(&csv).expect_err("missing");
        assert!(err.contains("csv.paths[0]") && err.contains("/no/such/trace.csv"), "{err}");
        assert!(check_paths(&CsvParams::default()).expect_err("none").contains("paths"));
    }
}
