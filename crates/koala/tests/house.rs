//! The layout stays readable: no import loop between the files of a crate spans more than
//! [`MAX_LOOP`] files, the coordinator's config imports nothing of the job driver, and no source
//! file passes [`MAX_LINES`] lines.
//!
//! Imports are read from the source text: `use` trees and inline paths that start with `crate::`,
//! `super::`, `self::` or a child module's name, resolved to the file of the longest module
//! prefix. A file naming one of its ancestor modules (a child naming its parent, or the crate root's
//! re-exports) does not count, nor do test modules (`#[cfg(test)]` files and inline blocks) or
//! comments. `cargo test -p koala --test house -- --nocapture` prints every loop of two or more
//! files, largest first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most files one import loop may span.
const MAX_LOOP: usize = 3;
/// The most lines one source file may have.
const MAX_LINES: usize = 800;

/// A module path inside one crate (`[]` is the crate root).
type ModPath = Vec<String>;

fn repo_root() -> PathBuf {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    Path::new(&dir).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under a crate's `src/`, or `None` for a second binary's root.
fn module_path(rel: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop()?;
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    match last.as_str() {
        "lib.rs" | "main.rs" if parts.is_empty() => Some(parts),
        "mod.rs" => Some(parts),
        name => {
            parts.push(name.trim_end_matches(".rs").to_string());
            Some(parts)
        }
    }
}

/// The text without comments, string literals' contents and the inline `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut previous = "";
    for line in text.lines() {
        let trimmed = line.trim_start();
        if previous == "#[cfg(test)]" && trimmed.starts_with("mod ") && trimmed.trim_end().ends_with('{') {
            break;
        }
        previous = if trimmed.is_empty() { previous } else { trimmed.trim_end() };
        let mut in_string = false;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '"' => in_string = !in_string,
                '\\' if in_string => {
                    chars.next();
                }
                '/' if !in_string && chars.peek() == Some(&'/') => break,
                _ if in_string => {}
                _ => out.push(c),
            }
        }
        out.push('\n');
    }
    out
}

/// The child modules a file declares, and which of them are test-only.
fn declared_children(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut all, mut tests) = (BTreeSet::new(), BTreeSet::new());
    let mut previous = String::new();
    for line in text.lines() {
        let t = line.trim();
        let decl = t.strip_prefix("pub ").unwrap_or(t);
        let decl = decl.strip_prefix("pub(crate) ").unwrap_or(decl);
        if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            all.insert(name.trim().to_string());
            if previous == "#[cfg(test)]" {
                tests.insert(name.trim().to_string());
            }
        }
        if !t.is_empty() {
            previous = t.to_string();
        }
    }
    (all, tests)
}

/// Expands one `use` tree (`a::{b, c::{d as e}}`) into its paths, each with the name it binds.
fn expand_use(tree: &str) -> Vec<(Vec<String>, String)> {
    let words: Vec<&str> = tree.split_whitespace().collect();
    let tree = words.join(" ").replace(" as ", "@").replace(' ', "");
    let mut out = Vec::new();
    expand_into(&tree, &mut Vec::new(), &mut out);
    out
}

fn expand_into(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    match tree.find('{') {
        Some(open) if tree.ends_with('}') => {
            let head: Vec<String> =
                tree[..open].split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
            let depth = prefix.len();
            prefix.extend(head);
            for part in split_top(&tree[open + 1..tree.len() - 1]) {
                expand_into(part, prefix, out);
            }
            prefix.truncate(depth);
        }
        _ => {
            let (tree, alias) = tree.split_once('@').map_or((tree, None), |(t, a)| (t, Some(a)));
            let mut path = prefix.clone();
            path.extend(tree.split("::").filter(|s| !s.is_empty()).map(str::to_string));
            let name = alias.map(str::to_string).or_else(|| path.last().cloned()).unwrap_or_default();
            out.push((path, name));
        }
    }
}

/// Splits at the commas that are not inside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < s.len() {
        parts.push(&s[start..]);
    }
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// A path the code names, and whether it is a re-export (`pub use`) and the name it binds.
struct Named {
    path: Vec<String>,
    reexport: Option<String>,
}

/// Every path the code names: `use` trees whole, other paths as `a::b::c` runs.
fn named_paths(code: &str) -> Vec<Named> {
    let mut out = Vec::new();
    let mut rest = code;
    // `use` statements first, removed from the text.
    let mut plain = String::new();
    while let Some(at) = find_use(rest) {
        plain.push_str(&rest[..at]);
        let after = &rest[at..];
        let end = after.find(';').unwrap_or(after.len());
        let stmt = after[..end].trim_start();
        let private = !stmt.starts_with("pub");
        let stmt = stmt.split_once("use ").map_or("", |(_, tree)| tree);
        for (path, name) in expand_use(stmt) {
            if path.last().is_some_and(|s| s == "*" || s == "self") {
                let path = path[..path.len() - 1].to_vec();
                out.push(Named { path, reexport: None });
            } else {
                out.push(Named { path, reexport: (!private).then_some(name) });
            }
        }
        rest = &after[end..];
    }
    plain.push_str(rest);
    let bytes: Vec<char> = plain.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        if is_ident(bytes[i]) && (i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == ':')) {
            let mut path = Vec::new();
            let mut j = i;
            loop {
                let start = j;
                while j < bytes.len() && is_ident(bytes[j]) {
                    j += 1;
                }
                path.push(bytes[start..j].iter().collect::<String>());
                if j + 2 < bytes.len() && bytes[j] == ':' && bytes[j + 1] == ':' && is_ident(bytes[j + 2]) {
                    j += 2;
                } else {
                    break;
                }
            }
            if path.len() > 1 {
                out.push(Named { path, reexport: None });
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Where the next `use` statement starts (at a line's start, after visibility).
fn find_use(text: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        let t2 = match t.strip_prefix("pub") {
            Some(rest) if rest.starts_with('(') => rest.split_once(") ").map_or(t, |(_, r)| r),
            Some(rest) => rest.trim_start(),
            None => t,
        };
        if t2.starts_with("use ") {
            return Some(offset + (line.len() - t.len()));
        }
        offset += line.len();
    }
    None
}

/// One crate's files: module path → (file, imported module paths).
struct Crate {
    files: BTreeMap<ModPath, PathBuf>,
    imports: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

fn read_crate(src: &Path) -> Crate {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let mut files = BTreeMap::new();
    let mut texts = BTreeMap::new();
    for path in paths {
        let Some(module) = module_path(path.strip_prefix(src).expect("under src")) else { continue };
        let text = std::fs::read_to_string(&path).expect("read a source file");
        files.insert(module.clone(), path);
        texts.insert(module, text);
    }
    // Test-only files: declared under `#[cfg(test)]` by their parent, or below such a file.
    let mut test_only: BTreeSet<ModPath> = BTreeSet::new();
    for (module, text) in &texts {
        for child in declared_children(text).1 {
            let mut m = module.clone();
            m.push(child);
            test_only.insert(m);
        }
    }
    let is_test = |m: &ModPath| (1..=m.len()).any(|n| test_only.contains(&m[..n]));
    files.retain(|m, _| !is_test(m));
    // Each file's paths made absolute; its re-exports (`pub use`) by the name they bind.
    let mut named: BTreeMap<ModPath, Vec<(ModPath, bool)>> = BTreeMap::new();
    let mut reexports: BTreeMap<ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
    for module in files.keys() {
        let text = &texts[module];
        let children = declared_children(text).0;
        let mut paths = Vec::new();
        for n in named_paths(&code_of(text)) {
            let Some(absolute) = absolute(module, &children, &n.path) else { continue };
            let is_reexport = n.reexport.is_some();
            if let Some(name) = n.reexport {
                reexports.entry(module.clone()).or_default().insert(name, absolute.clone());
            }
            paths.push((absolute, is_reexport));
        }
        named.insert(module.clone(), paths);
    }
    let mut imports = BTreeMap::new();
    for (module, paths) in &named {
        let mut found = BTreeSet::new();
        for (path, reexport) in paths {
            if *reexport {
                continue; // handing a name on is not using it
            }
            let target = resolve(&files, &reexports, path, 0);
            if let Some(target) = target
                && &target != module
                && !module.starts_with(&target)
            {
                found.insert(target);
            }
        }
        imports.insert(module.clone(), found);
    }
    Crate { files, imports }
}

/// A path named in `module` made absolute, or `None` for a path into another crate.
fn absolute(module: &ModPath, children: &BTreeSet<String>, named: &[String]) -> Option<ModPath> {
    Some(match named.first()?.as_str() {
        "crate" => named[1..].to_vec(),
        "self" => [module.clone(), named[1..].to_vec()].concat(),
        "super" => {
            let mut base = module.clone();
            let mut rest = named;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            [base, rest.to_vec()].concat()
        }
        first if children.contains(first) => [module.clone(), named.to_vec()].concat(),
        _ => return None,
    })
}

/// The file an absolute path lands in: the longest module prefix that is a file, followed
/// through that module's re-exports to where the name is defined.
fn resolve(
    files: &BTreeMap<ModPath, PathBuf>,
    reexports: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    path: &[String],
    depth: usize,
) -> Option<ModPath> {
    let n = (0..=path.len()).rev().find(|&n| files.contains_key(&path[..n].to_vec()))?;
    let module = path[..n].to_vec();
    if depth < 8
        && let Some(name) = path.get(n)
        && let Some(target) = reexports.get(&module).and_then(|r| r.get(name))
    {
        let followed: ModPath = [target.clone(), path[n + 1..].to_vec()].concat();
        return resolve(files, reexports, &followed, depth + 1).or(Some(module));
    }
    Some(module)
}

/// The strongly connected components of two or more files (Tarjan).
fn loops(c: &Crate) -> Vec<Vec<ModPath>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on_stack: BTreeSet<ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit(w: &mut Walk<'_>, v: &ModPath) {
        let n = w.index.len();
        w.index.insert(v.clone(), n);
        w.low.insert(v.clone(), n);
        w.stack.push(v.clone());
        w.on_stack.insert(v.clone());
        for u in w.graph.get(v).into_iter().flatten() {
            if !w.index.contains_key(u) {
                visit(w, u);
                let low = w.low[v].min(w.low[u]);
                w.low.insert(v.clone(), low);
            } else if w.on_stack.contains(u) {
                let low = w.low[v].min(w.index[u]);
                w.low.insert(v.clone(), low);
            }
        }
        if w.low[v] == w.index[v] {
            let mut component = Vec::new();
            while let Some(u) = w.stack.pop() {
                w.on_stack.remove(&u);
                let done = &u == v;
                component.push(u);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                w.out.push(component);
            }
        }
    }
    let mut w = Walk {
        graph: &c.imports,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in c.files.keys() {
        if !w.index.contains_key(v) {
            visit(&mut w, v);
        }
    }
    w.out.sort_by_key(|c| std::cmp::Reverse(c.len()));
    w.out
}

fn crates() -> Vec<(String, Crate)> {
    let root = repo_root().join("crates");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .expect("crates/")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("src").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.into_iter().map(|n| (n.clone(), read_crate(&root.join(&n).join("src")))).collect()
}

fn show(c: &Crate, m: &ModPath) -> String {
    c.files[m].strip_prefix(repo_root()).unwrap_or(&c.files[m]).display().to_string()
}

#[test]
fn no_import_loop_spans_more_than_three_files() {
    let mut too_long = Vec::new();
    for (name, c) in crates() {
        for component in loops(&c) {
            let files: Vec<String> = component.iter().map(|m| show(&c, m)).collect();
            println!("{name}: loop of {} files: {}", files.len(), files.join(", "));
            if component.len() > MAX_LOOP {
                too_long.push(format!("{name} ({} files): {}", files.len(), files.join(", ")));
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "import loops longer than {MAX_LOOP} files (move the shared piece into a leaf module):\n{}",
        too_long.join("\n")
    );
}

#[test]
fn the_coordinator_config_imports_nothing_of_the_job_driver() {
    let c = read_crate(&repo_root().join("crates/coordinator/src"));
    let config = vec!["config".to_string()];
    let mut outside = Vec::new();
    for (module, imports) in &c.imports {
        if !module.starts_with(&config) {
            continue;
        }
        for target in imports.iter().filter(|t| !t.starts_with(&config)) {
            outside.push(format!("{} imports {}", show(&c, module), show(&c, target)));
        }
    }
    assert!(outside.is_empty(), "the config must be a leaf of the coordinator:\n{}", outside.join("\n"));
}

#[test]
fn no_source_file_passes_the_line_limit() {
    let mut paths = Vec::new();
    rust_files(&repo_root().join("crates"), &mut paths);
    rust_files(&repo_root().join("fuzz"), &mut paths);
    assert!(paths.len() > 100, "found only {} source files: is the repository root right?", paths.len());
    let long: Vec<String> = paths
        .iter()
        .filter_map(|p| {
            let lines = std::fs::read_to_string(p).ok()?.lines().count();
            (lines > MAX_LINES)
                .then(|| format!("{} ({lines} lines)", p.strip_prefix(repo_root()).unwrap_or(p).display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines (split them by purpose):\n{}",
        long.join("\n")
    );
}

/// The reader itself: it finds the loop it is shown, and ignores what does not count.
#[test]
fn the_import_reader_sees_use_trees_inline_paths_and_ignores_parents_and_tests() {
    let paths = named_paths(&code_of(
        "use crate::{a::B, c::{d::E, F}};\nuse super::g as h;\nfn f() { crate::x::y(); } // crate::no::Thing\n\
         let s = \"crate::quoted::Thing\";\n#[cfg(test)]\nmod tests {\n    use crate::hidden::X;\n}\n",
    ));
    let as_text: Vec<String> = paths.iter().map(|p| p.path.join("::")).collect();
    for expected in ["crate::a::B", "crate::c::d::E", "crate::c::F", "super::g", "crate::x::y"] {
        assert!(as_text.contains(&expected.to_string()), "missing {expected} in {as_text:?}");
    }
    for absent in ["crate::no::Thing", "crate::quoted::Thing", "crate::hidden::X"] {
        assert!(!as_text.iter().any(|p| p == absent), "{absent} should not be read: {as_text:?}");
    }
    let dir = std::env::temp_dir().join(format!("koala-house-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("p")).expect("temp dir");
    let write = |rel: &str, text: &str| std::fs::write(src.join(rel), text).expect("write");
    write("lib.rs", "mod a;\nmod b;\nmod p;\n#[cfg(test)]\nmod t;\npub use a::A;\n");
    write("a.rs", "use crate::b::B;\npub struct A;\n");
    write("b.rs", "pub struct B(crate::p::Q);\n");
    write("p/mod.rs", "pub mod q;\npub use q::Q;\nuse crate::a::A;\n");
    write("p/q.rs", "use super::Thing;\nuse crate::a::A;\nuse crate::A as Root;\npub struct Q;\n");
    write("t.rs", "use crate::a::A;\nuse crate::b::B;\n");
    let c = read_crate(&src);
    assert!(!c.files.contains_key(&vec!["t".to_string()]), "a test-only file counts");
    let found = loops(&c);
    let _ = std::fs::remove_dir_all(&dir);
    let names: Vec<Vec<String>> = found.iter().map(|l| l.iter().map(|m| m.join("::")).collect()).collect();
    // `b` names `p::Q`, which `p` re-exports from `p::q`; `p::q` naming its parent `p` (which
    // imports `a`) does not close a loop through `p`.
    assert_eq!(names, vec![vec!["a".to_string(), "b".into(), "p::q".into()]]);
}

/// The simulator and the fault-injection hooks (koala-protocol's `sim` feature) are enabled only
/// by dev-dependencies, so a release build (`cargo build --release -p koala`) has neither.
#[test]
fn only_dev_dependencies_enable_the_simulator() {
    let root = repo_root();
    let mut manifests = vec![root.join("Cargo.toml")];
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/").filter_map(|e| e.ok()) {
        let manifest = entry.path().join("Cargo.toml");
        if manifest.is_file() {
            manifests.push(manifest);
        }
    }
    let mut enabling = Vec::new();
    let mut checked = 0;
    for manifest in &manifests {
        let text = std::fs::read_to_string(manifest).expect("read a manifest");
        let mut section = String::new();
        for line in text.lines() {
            let t = line.trim();
            if t.starts_with('[') {
                section = t.to_string();
                continue;
            }
            let dev = section.contains("dev-dependencies");
            let is_protocol = t.starts_with("koala-protocol");
            if is_protocol && !dev {
                checked += 1;
            }
            if is_protocol && !dev && t.contains("\"sim\"") {
                enabling.push(format!("{} {section}: {t}", manifest.display()));
            }
            if section == "[features]" && t.starts_with("default") && t.contains("\"sim\"") {
                enabling.push(format!("{} [features]: {t}", manifest.display()));
            }
        }
    }
    assert!(
        checked >= 4,
        "found koala-protocol in only {checked} non-dev dependency lines: did the layout change?"
    );
    assert!(
        enabling.is_empty(),
        "the simulator is enabled outside dev-dependencies:\n{}",
        enabling.join("\n")
    );
}
