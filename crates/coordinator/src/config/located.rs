//! Config errors placed where they are in the file: `job.toml:12:1: parallelism.windw: …`. A
//! parse or type error carries the parser's byte span; a check after parsing names a dotted
//! field (`reconfigurations[0].at_s`, `params.source.rate[0].records_per_sec`), which
//! [`ConfigSource::locate`] finds in the document's syntax tree (`toml_edit` keeps the spans).
//! Messages speak of numbers, text and tables, not of the Rust types they deserialize into.

use std::ops::Range;

use toml_edit::{ImDocument, Item, Table, Value};

/// A config that does not make sense, with the field at fault and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is not valid TOML, or has an unknown or mistyped field.
    #[error("{path}: {message}")]
    Parse {
        /// The config file (with `:line:column` when known).
        path: String,
        /// What is wrong and how to fix it, with the offending line.
        message: String,
    },
    /// A field has a value that cannot work.
    #[error("{field}: {message}")]
    Invalid {
        /// Dotted path of the field, e.g. `parallelism.aggregate`.
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// An [`Invalid`](Self::Invalid) field, placed in its file.
    #[error("{path}: {field}: {message}{excerpt}")]
    Located {
        /// `file:line:column` of the field's key (or `file` when the key is not in the file).
        path: String,
        /// Dotted path of the field.
        field: String,
        /// What is wrong and how to fix it.
        message: String,
        /// The offending line with a caret under the key (empty when not in the file).
        excerpt: String,
    },
}

/// A [`ConfigError::Invalid`].
pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.into(), message: message.into() }
}

/// A config's text and the file it came from, to point errors at the line of their key.
pub struct ConfigSource<'a> {
    origin: &'a str,
    text: &'a str,
    document: Option<ImDocument<&'a str>>,
}

impl<'a> ConfigSource<'a> {
    /// The text of the config file `origin`.
    pub fn new(origin: &'a str, text: &'a str) -> Self {
        Self { origin, text, document: ImDocument::parse(text).ok() }
    }

    /// Line and column (both from 1) where the key of the dotted `field` is written, e.g.
    /// `parallelism.window`, `reconfigurations[1].at_s`, `params.source.rate[0].records_per_sec`
    /// (an array element: where the element starts). A field not in the file: its nearest
    /// enclosing table or key that is (`[runtime]` for `runtime.batch_records` left at its
    /// default); `None` when not even that is.
    pub fn locate(&self, field: &str) -> Option<(usize, usize)> {
        self.span_of(field).map(|s| self.line_column(s.start))
    }

    /// Whether the whole dotted `field` is written in the file.
    fn contains(&self, field: &str) -> bool {
        let Some(document) = &self.document else { return false };
        let segments = segments(field);
        walk(document.as_table(), &segments).is_some_and(|(_, depth)| depth == segments.len())
    }

    fn span_of(&self, field: &str) -> Option<Range<usize>> {
        let document = self.document.as_ref()?;
        walk(document.as_table(), &segments(field)).map(|(span, _)| span)
    }

    fn line_column(&self, offset: usize) -> (usize, usize) {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, column)
    }

    /// `file:line:column` and the excerpt (the line, a caret under `column`) of `offset`.
    fn place(&self, offset: usize) -> (String, String) {
        let (line, column) = self.line_column(offset);
        let text = self.text.lines().nth(line - 1).unwrap_or("");
        let gutter = line.to_string().len();
        let excerpt = format!("\n {:gutter$} |\n {line} | {text}\n {:gutter$} | {:>column$}", "", "", "^");
        (format!("{}:{line}:{column}", self.origin), excerpt)
    }

    /// `error` placed in this file: an [`Invalid`](ConfigError::Invalid) field at its key's line
    /// (or, for `params` whose message names a parameter, at that parameter's line); a
    /// [`Parse`](ConfigError::Parse) error as it was.
    pub fn place_error(&self, error: ConfigError) -> ConfigError {
        let ConfigError::Invalid { field, message } = error else { return error };
        let field =
            if field == "params" { self.parameter_named_in(&message).unwrap_or(field) } else { field };
        // A field left at its default is at fault with another that is written (`protocol =
        // "drrs"` needs `partition_policy = "uniform"`): the line of the one the message quotes.
        let span = match self.contains(&field) {
            true => self.span_of(&field),
            false => self.assignment_quoted_in(&message).or_else(|| self.span_of(&field)),
        };
        match span {
            Some(span) => {
                let (path, excerpt) = self.place(span.start);
                ConfigError::Located { path, field, message, excerpt }
            }
            None => {
                ConfigError::Located { path: self.origin.to_string(), field, message, excerpt: String::new() }
            }
        }
    }

    /// The span of the first written key the message quotes as `key = value`.
    fn assignment_quoted_in(&self, message: &str) -> Option<Range<usize>> {
        message.match_indices(" = ").find_map(|(at, _)| {
            let before = &message[..at];
            let start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']')))
                .map_or(0, |i| i + 1);
            let key = &before[start..];
            (!key.is_empty() && self.contains(key)).then(|| self.span_of(key)).flatten()
        })
    }

    /// The first parameter a query's message names that is written under `[params]`:
    /// `source.rate[0].records_per_sec = -5: …` → `params.source.rate[0].records_per_sec`,
    /// `keyed events generator: key_space must be positive` → `params.generator.key_space`.
    fn parameter_named_in(&self, message: &str) -> Option<String> {
        let written = self.paths_under("params");
        words(message).into_iter().find_map(|word| {
            let full = format!("params.{word}");
            if self.contains(&full) {
                return Some(full);
            }
            // A bare name: the one written parameter it ends.
            let suffix = format!(".{word}");
            let mut matches = written.iter().filter(|p| p.ends_with(&suffix));
            match (matches.next(), matches.next()) {
                (Some(only), None) => Some(only.clone()),
                _ => None,
            }
        })
    }

    /// Every dotted key path written under the table `root`.
    fn paths_under(&self, root: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(Item::Table(t)) = self.document.as_ref().and_then(|d| d.as_table().get(root)) {
            collect(t, root, &mut out);
        }
        out
    }

    /// A parse or type error from the `toml` crate, placed at its span, naming the field it is
    /// in and saying what was expected in words.
    pub fn parse_error(&self, error: &toml::de::Error) -> ConfigError {
        let message = plain_words(error.message());
        let Some(span) = error.span() else {
            return ConfigError::Parse { path: self.origin.to_string(), message };
        };
        let (path, excerpt) = self.place(span.start);
        let field = self.document.as_ref().and_then(|d| field_at(d.as_table(), span.start, ""));
        let message = match field {
            Some(field) if !field.is_empty() => format!("{field}: {message}"),
            _ => message,
        };
        ConfigError::Parse { path, message: format!("{message}{excerpt}") }
    }
}

/// `a.b[2].c` as segments: `a`, `b`, `[2]`, `c`.
fn segments(field: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (name, mut rest) = part.split_once('[').map_or((part, ""), |(n, r)| (n, r));
        if !name.is_empty() {
            out.push(Segment::Key(name));
        }
        while let Some((index, after)) = rest.split_once(']') {
            if let Ok(i) = index.parse() {
                out.push(Segment::Index(i));
            }
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

/// A node of the syntax tree: a table (`[x]`, `[[x]]`, inline), an array or a plain value.
#[derive(Clone, Copy)]
enum Node<'a> {
    Table(&'a dyn toml_edit::TableLike),
    Tables(&'a toml_edit::ArrayOfTables),
    Array(&'a toml_edit::Array),
    Leaf,
}

fn node(item: &Item) -> Node<'_> {
    match item {
        Item::Table(t) => Node::Table(t),
        Item::ArrayOfTables(a) => Node::Tables(a),
        Item::Value(v) => value_node(v),
        Item::None => Node::Leaf,
    }
}

fn value_node(value: &Value) -> Node<'_> {
    match value {
        Value::InlineTable(t) => Node::Table(t),
        Value::Array(a) => Node::Array(a),
        _ => Node::Leaf,
    }
}

/// The span of the deepest segment of `path` written under `root`, and how many segments
/// were found.
fn walk(root: &Table, path: &[Segment<'_>]) -> Option<(Range<usize>, usize)> {
    let mut here = Node::Table(root);
    let mut found: Option<Range<usize>> = None;
    for (depth, segment) in path.iter().enumerate() {
        let next = match (here, segment) {
            (Node::Table(t), Segment::Key(k)) => t.get_key_value(k).map(|(key, item)| {
                // A `[header]` or `[[header]]` table: its header line; else the key.
                let span = match item {
                    Item::Table(t) if !t.is_dotted() => t.span().or_else(|| key.span()),
                    _ => key.span().or_else(|| item.span()),
                };
                (span, node(item))
            }),
            (Node::Tables(a), Segment::Index(i)) => a.get(*i).map(|t| (t.span(), Node::Table(t))),
            (Node::Array(a), Segment::Index(i)) => a.get(*i).map(|v| (v.span(), value_node(v))),
            _ => None,
        };
        let Some((span, next)) = next else { return found.map(|s| (s, depth)) };
        found = span.or(found);
        here = next;
    }
    found.map(|s| (s, path.len()))
}

/// The dotted path of the deepest key whose key or value contains byte `offset`.
fn field_at(table: &dyn toml_edit::TableLike, offset: usize, prefix: &str) -> Option<String> {
    for (name, item) in table.iter() {
        let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
        let key_span = table.get_key_value(name).and_then(|(k, _)| k.span());
        let inside = |s: Option<Range<usize>>| s.is_some_and(|s| s.contains(&offset));
        if let Some(deeper) = field_in(node(item), offset, &path) {
            return Some(deeper);
        }
        if inside(key_span) || inside(item.span()) {
            return Some(path);
        }
    }
    None
}

fn field_in(node: Node<'_>, offset: usize, path: &str) -> Option<String> {
    match node {
        Node::Table(t) => field_at(t, offset, path),
        Node::Tables(a) => {
            a.iter().enumerate().find_map(|(i, t)| field_at(t, offset, &format!("{path}[{i}]")))
        }
        Node::Array(a) => a.iter().enumerate().find_map(|(i, v)| {
            let here = format!("{path}[{i}]");
            field_in(value_node(v), offset, &here)
                .or_else(|| v.span().is_some_and(|s| s.contains(&offset)).then_some(here))
        }),
        Node::Leaf => None,
    }
}

/// Every dotted key path under `table`, its own name `prefix`.
fn collect(table: &dyn toml_edit::TableLike, prefix: &str, out: &mut Vec<String>) {
    for (name, item) in table.iter() {
        let path = format!("{prefix}.{name}");
        match node(item) {
            Node::Table(t) => collect(t, &path, out),
            _ => out.push(path),
        }
    }
}

/// The words of a message that could be a parameter path (`source.rate[0].records_per_sec`,
/// `key_space`), in order.
fn words(message: &str) -> Vec<&str> {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']')))
        .map(|w| w.trim_matches('.'))
        .filter(|w| w.contains('_') || w.contains('.'))
        .collect()
}

/// A serde/TOML message in a user's words: Rust types become what to write (`expected u32`
/// → `expected a whole number, 0 or more`), and `unknown field` lists what is known.
pub fn plain_words(message: &str) -> String {
    let message = message.trim();
    if let Some(rest) = message.strip_prefix("unknown field ") {
        return match rest.split_once(", expected ") {
            Some((field, known)) => {
                format!(
                    "unknown field {field} (a typo?); the fields here are {}",
                    known.trim_start_matches("one of ")
                )
            }
            None => format!("unknown field {rest}"),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        return match rest.split_once(", expected ") {
            Some((value, known)) => {
                format!("unknown value {value}; use {}", known.trim_start_matches("one of "))
            }
            None => format!("unknown value {rest}"),
        };
    }
    if let Some(field) = message.strip_prefix("missing field ") {
        return format!("missing field {field}; add it (see the example configs in examples/)");
    }
    for (prefix, what) in
        [("invalid type: ", "is not what goes here"), ("invalid value: ", "is not allowed here")]
    {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.split_once(", expected ")
        {
            return format!("{} {what}: expected {}", found_words(found), expected_words(expected));
        }
    }
    match message.split_once("expected ") {
        Some((before, expected)) if type_words(expected.trim()).is_some() => {
            format!("{before}expected {}", expected_words(expected))
        }
        _ => message.to_string(),
    }
}

/// What the parser found, e.g. `string "two"` → `the text "two"`, `integer `-5`` → `-5`.
fn found_words(found: &str) -> String {
    let found = found.trim();
    for (kind, words) in
        [("string ", "the text "), ("integer ", ""), ("floating point ", ""), ("boolean ", "")]
    {
        if let Some(v) = found.strip_prefix(kind) {
            return format!("{words}{}", v.trim_matches('`'));
        }
    }
    match found {
        "sequence" => "a list".to_string(),
        "map" => "a table".to_string(),
        other => other.to_string(),
    }
}

/// What was expected, in words.
fn expected_words(expected: &str) -> String {
    let expected = expected.trim();
    type_words(expected).map_or_else(|| expected.to_string(), str::to_string)
}

fn type_words(expected: &str) -> Option<&'static str> {
    Some(match expected {
        "u8" => "a whole number from 0 to 255",
        "u16" => "a whole number from 0 to 65535",
        "u32" | "u64" | "u128" | "usize" => "a whole number, 0 or more",
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number",
        "f32" | "f64" => "a number (e.g. 1.5)",
        "a boolean" => "true or false",
        "a string" | "a borrowed string" | "a character" => "text in quotes",
        "a sequence" => "a list, e.g. [1, 2]",
        "a map" => "a table",
        e if e.starts_with("struct ") => "a table",
        e if e.starts_with("a string or") => "text in quotes",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "query = \"tumbling-window\"\nworkers = 2\n\n[parallelism]\nwindw = 2\n\n\
        [params]\nsink = \"discard\"\n[params.source]\nrate = [{ at_ms = 0, records_per_sec = 10.0 }, { at_ms = 5, records_per_sec = -5.0 }]\n\
        [params.generator]\nkey_space = 0\n\n[[reconfigurations]]\nat_s = 1\noperator = \"window\"\n\n[[reconfigurations]]\nat_s = -1\noperator = \"window\"\n";

    #[test]
    fn a_dotted_field_is_found_at_its_key() {
        let source = ConfigSource::new("job.toml", CONFIG);
        assert_eq!(source.locate("parallelism.windw"), Some((5, 1)));
        assert_eq!(source.locate("workers"), Some((2, 1)));
        assert_eq!(source.locate("reconfigurations[1].at_s"), Some((19, 1)));
        assert_eq!(source.locate("params.source.rate[1].records_per_sec"), Some((10, 61)));
        // Not written: its table's header; nothing at all: no place.
        assert_eq!(source.locate("parallelism.sink"), Some((4, 1)));
        assert_eq!(source.locate("runtime.batch_records"), None);
    }

    #[test]
    fn an_invalid_field_is_placed_with_its_line() {
        let source = ConfigSource::new("job.toml", CONFIG);
        let placed = source.place_error(invalid("parallelism.windw", "query has no operator \"windw\""));
        let text = placed.to_string();
        assert!(text.starts_with("job.toml:5:1: parallelism.windw: query has no operator"), "{text}");
        assert!(text.contains("5 | windw = 2"), "{text}");
        // A query's message about its parameters: the parameter it names.
        let rate =
            source.place_error(invalid("params", "source.rate[1].records_per_sec = -5: give a rate ≥ 0"));
        assert!(
            rate.to_string().starts_with("job.toml:10:61: params.source.rate[1].records_per_sec:"),
            "{rate}"
        );
        let keys =
            source.place_error(invalid("params", "keyed events generator: key_space must be positive"));
        assert!(keys.to_string().starts_with("job.toml:12:1: params.generator.key_space:"), "{keys}");
        // A field at its default, at fault with one the message quotes: that one's line.
        let quoted = source
            .place_error(invalid("partition_policy", "workers = 2 needs partition_policy = \"uniform\""));
        assert!(quoted.to_string().starts_with("job.toml:2:1: partition_policy: workers = 2"), "{quoted}");
        let nowhere = source.place_error(invalid("runtime.batch_records", "must be at least 1"));
        assert_eq!(nowhere.to_string(), "job.toml: runtime.batch_records: must be at least 1");
    }

    #[test]
    fn type_errors_name_the_field_and_speak_of_numbers_not_rust_types() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Job {
            workers: u32,
            runtime: Runtime,
        }
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Runtime {
            linger_ms: u64,
        }
        let text = "workers = -2\n[runtime]\nlinger_ms = 1\n";
        let err = toml::from_str::<Job>(text).expect_err("negative");
        let placed = ConfigSource::new("job.toml", text).parse_error(&err).to_string();
        assert!(placed.starts_with("job.toml:1:11: workers: -2 is not allowed"), "{placed}");
        assert!(placed.contains("a whole number, 0 or more") && !placed.contains("u32"), "{placed}");
        let text = "workers = 2\n[runtime]\nlinger_ms = \"5\"\n";
        let err = toml::from_str::<Job>(text).expect_err("text");
        let placed = ConfigSource::new("job.toml", text).parse_error(&err).to_string();
        assert!(
            placed.starts_with("job.toml:3:13: runtime.linger_ms: the text \"5\" is not what goes here"),
            "{placed}"
        );
        let text = "workers = 2\n[runtime]\nlinger = 5\n";
        let err = toml::from_str::<Job>(text).expect_err("unknown");
        let placed = ConfigSource::new("job.toml", text).parse_error(&err).to_string();
        assert!(placed.starts_with("job.toml:3:1: runtime.linger: unknown field `linger` (a typo?); the fields here are `linger_ms`"), "{placed}");
    }
}
