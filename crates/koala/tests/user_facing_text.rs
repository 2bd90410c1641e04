//! What a user reads cites no development history they cannot resolve: README.md,
//! EXPERIMENTS.md, docs/*.md, every subcommand's `--help` and `koala experiment --list` name no
//! tracker issue, work session or round (the word followed by a number, or `#` and a number).
//! Provenance is a date and a commit ("measured 2026-12-05 on commit abc1234"); history that only
//! explains the past is in docs/history.md, by date.

mod common;

use common::koala;

/// Every reference to a tracker number, session or round in `text`: (line number, the line).
fn history_references(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| has_reference(&line.to_lowercase()))
        .map(|(i, line)| (i + 1, line.trim().to_string()))
        .collect()
}

/// A word of the tracker's or the work's vocabulary followed by a number (with a space, `-`,
/// `_`, `#` between, in either case, plural too), or `#` and a number standing alone.
fn has_reference(line: &str) -> bool {
    let bytes = line.as_bytes();
    for word in ["issue", "session", "round", "ticket", "tracker"] {
        for (at, _) in line.match_indices(word) {
            if at > 0 && bytes[at - 1].is_ascii_alphanumeric() {
                continue;
            }
            let mut rest = &line[at + word.len()..];
            rest = rest.strip_prefix('s').unwrap_or(rest);
            rest = rest.strip_prefix([' ', '_', '-']).unwrap_or(rest);
            rest = rest.strip_prefix('#').unwrap_or(rest);
            if rest.starts_with(|c: char| c.is_ascii_digit()) {
                return true;
            }
        }
    }
    line.match_indices('#').any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let digits = line[at + 1..].chars().take_while(char::is_ascii_digit).count();
        let after = line[at + 1 + digits..].chars().next();
        digits > 0
            && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '&')
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[test]
fn the_matcher_finds_every_form_and_nothing_else() {
    // `I` and `S` stand for the two words, so this file itself names no issue or session.
    for hit in [
        "I 26",
        "I 28, point 8",
        "Is 5",
        "I-13 set",
        "I_26_schedule",
        "S 17",
        "S 18's",
        "round 3",
        "(#31)",
        "ticket #4",
    ] {
        let hit = hit.replacen('I', "Issue", 1).replacen('S', "Session", 1);
        assert!(has_reference(&hit.to_lowercase()), "{hit}");
    }
    for fine in [
        "see §7",
        "rounds of a loop",
        "a round trip",
        "the issue is 3 lines",
        "#[ignore]",
        "colour #1f77b4",
        "&#39;",
        "step #a",
    ] {
        assert!(!has_reference(&fine.to_lowercase()), "{fine}");
    }
}

#[test]
fn docs_cite_dates_and_commits_not_tracker_numbers_or_sessions() {
    let root = common::repo_root();
    let mut files = vec![root.join("README.md"), root.join("EXPERIMENTS.md")];
    let docs = std::fs::read_dir(root.join("docs")).expect("docs/");
    let mut md: Vec<_> = docs
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    md.sort();
    files.extend(md);
    let mut found = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (line, text) in history_references(&text) {
            found.push(format!("{}:{line}: {text}", path.strip_prefix(&root).unwrap_or(path).display()));
        }
    }
    assert!(
        found.is_empty(),
        "references a user cannot resolve (give a date and commit instead):\n{}",
        found.join("\n")
    );
}

/// The subcommands `koala <path> --help` lists (its "Commands:" section), less `help`.
fn subcommands(path: &[&str]) -> Vec<String> {
    let out = koala().args(path).arg("--help").output().expect("koala --help");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

#[test]
fn help_and_the_experiment_list_cite_no_tracker_numbers_or_sessions() {
    let mut pages: Vec<Vec<String>> = vec![Vec::new()];
    let mut i = 0;
    while i < pages.len() {
        let path: Vec<&str> = pages[i].iter().map(String::as_str).collect();
        for sub in subcommands(&path) {
            let mut deeper = pages[i].clone();
            deeper.push(sub);
            pages.push(deeper);
        }
        i += 1;
    }
    assert!(pages.len() > 10, "found only {} help pages: {pages:?}", pages.len());
    let mut found = Vec::new();
    let mut read = |what: String, args: Vec<String>| {
        let out = koala().args(&args).output().expect("start koala");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!text.trim().is_empty(), "{what} printed nothing");
        for (line, text) in history_references(&text) {
            found.push(format!("{what}, line {line}: {text}"));
        }
    };
    for page in &pages {
        let mut args = page.clone();
        args.push("--help".into());
        read(format!("koala {}", args.join(" ")), args);
    }
    read("koala experiment --list".into(), vec!["experiment".into(), "--list".into()]);
    assert!(found.is_empty(), "references a user cannot resolve:\n{}", found.join("\n"));
}
