//! The repository is readable on its own: it cites its own documents, never
//! the design brief it was built to (which is not in the clone), and every
//! section it cites by name exists.
//!
//! - `no_file_cites_the_design_brief`: no text file outside
//!   `docs/bench-history/` (history, kept as written) names the brief:
//!   its name as a word in capitals (alone or as a file name) or the
//!   `design_section` of test names that cited it ([`BRIEF`]).
//! - `cited_sections_exist`: every `FORMAT.md, "Heading"` (or `FORMAT.md
//!   "Heading"`, `[FORMAT.md, "Heading"](…)`, with any of the project's
//!   documents) names a heading of that document, also when the citation is
//!   wrapped over comment lines. A short form is allowed when the heading
//!   goes on after it with `:` or ` (` ("The router" for "The router:
//!   shadow accounting, …").

use std::fs;
use std::path::{Path, PathBuf};

/// The documents a citation may name, and where they are.
const DOCUMENTS: [(&str, &str); 7] = [
    ("ARCHITECTURE", "docs/ARCHITECTURE.md"),
    ("FORMAT", "docs/FORMAT.md"),
    ("REDIS", "docs/REDIS.md"),
    ("ROUTING", "docs/ROUTING.md"),
    ("VLLM", "docs/VLLM.md"),
    ("README", "README.md"),
    ("BENCHMARKS", "BENCHMARKS.md"),
];

/// This test's own file: it spells what it looks for.
const THIS_FILE: &str = "tests/tests/repository_docs.rs";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the repository")
        .to_path_buf()
}

/// Every text file of the repository, as (path relative to the root, text):
/// not `target/`, hidden directories (`.git`, `.venv`, …), Python virtual
/// environments, or `docs/bench-history/`. Files that are not UTF-8 are
/// skipped (images, binaries).
fn text_files() -> Vec<(String, String)> {
    let root = root();
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("a directory entry");
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let relative = path
                .strip_prefix(&root)
                .expect("under the root")
                .to_string_lossy()
                .into_owned();
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                let skipped = name.starts_with('.')
                    || name == "target"
                    || name == "node_modules"
                    || relative == "docs/bench-history"
                    || path.join("pyvenv.cfg").exists();
                if !skipped {
                    dirs.push(path);
                }
            } else if kind.is_file() {
                if let Ok(text) = fs::read_to_string(&path) {
                    files.push((relative, text));
                }
            }
        }
    }
    files.sort();
    files
}

/// The brief's name, the one place this file spells it.
const BRIEF: &str = "DESIGN";

/// [`BRIEF`] as a word: not inside an identifier such as `NO_BRIEF_X`.
fn says_design(line: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    line.match_indices(BRIEF).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + BRIEF.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

#[test]
fn no_file_cites_the_design_brief() {
    let mut citations = Vec::new();
    for (path, text) in text_files() {
        if path == THIS_FILE {
            continue;
        }
        for (number, line) in text.lines().enumerate() {
            let lower = line.to_ascii_lowercase();
            if says_design(line)
                || lower.contains(&format!("{}.md", BRIEF.to_ascii_lowercase()))
                || lower.contains("design_section")
            {
                citations.push(format!("{path}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    assert!(
        citations.is_empty(),
        "{} line(s) cite the design brief, which is not in the repository; cite the \
         project's own document instead (docs/FORMAT.md, docs/VLLM.md, docs/ROUTING.md, \
         docs/REDIS.md, docs/ARCHITECTURE.md or the README, with the section's heading):\n{}",
        citations.len(),
        citations.join("\n")
    );
}

/// The headings of a Markdown document, outside fenced code blocks, without
/// their `#`s and backticks.
fn headings(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut headings = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            headings.push(line.trim_start_matches('#').trim().replace('`', ""));
        }
    }
    headings
}

/// The text with each line's indentation and comment or quote markers
/// (`///`, `//!`, `//`, `#`, `>`, `*`) removed and the lines joined by
/// spaces, so that a citation wrapped over comment lines reads as one; with
/// the line each byte came from.
fn joined(text: &str) -> (String, Vec<usize>) {
    let (mut out, mut lines) = (String::new(), Vec::new());
    for (number, line) in text.lines().enumerate() {
        let mut rest = line.trim_start();
        for marker in ["///", "//!", "//", "#", ">", "*"] {
            if let Some(stripped) = rest.strip_prefix(marker) {
                rest = stripped.trim_start();
                break;
            }
        }
        for _ in 0..rest.len() + 1 {
            lines.push(number + 1);
        }
        out.push_str(rest);
        out.push(' ');
    }
    (out, lines)
}

/// The `(document, heading)` citations in `text`, with their line numbers:
/// `NAME.md` followed by `, "…"`, ` "…"` or `, "…"` inside a link's brackets.
fn citations(text: &str) -> Vec<(&'static str, String, usize)> {
    let (text, lines) = joined(text);
    let mut found = Vec::new();
    for (name, _) in DOCUMENTS {
        let needle = format!("{name}.md");
        for (at, _) in text.match_indices(&needle) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue; // e.g. `MY_FORMAT.md`
            }
            let rest = &text[at + needle.len()..];
            let rest = rest.strip_prefix(']').unwrap_or(rest);
            let rest = rest.strip_prefix(',').unwrap_or(rest);
            let Some(quoted) = rest.strip_prefix(" \"") else {
                continue;
            };
            let Some(end) = quoted.find('"') else {
                continue;
            };
            let heading = quoted[..end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            found.push((name, heading.replace('`', ""), lines[at]));
        }
    }
    found
}

#[test]
fn cited_sections_exist() {
    let root = root();
    let documents: Vec<(&str, Vec<String>)> = DOCUMENTS
        .iter()
        .map(|&(name, path)| {
            let text =
                fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
            (name, headings(&text))
        })
        .collect();
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in text_files() {
        if path == THIS_FILE {
            continue; // its docs show the forms, with a placeholder heading
        }
        for (name, cited, line) in citations(&text) {
            checked += 1;
            let (_, headings) = documents.iter().find(|(n, _)| *n == name).expect("known");
            let exists = headings.iter().any(|heading| {
                heading == &cited
                    || heading.starts_with(&format!("{cited}:"))
                    || heading.starts_with(&format!("{cited} ("))
            });
            if !exists {
                broken.push(format!(
                    "{path}:{line}: {name}.md has no section \"{cited}\""
                ));
            }
        }
    }
    assert!(checked > 0, "no citation found: the scanner is broken");
    assert!(
        broken.is_empty(),
        "{} citation(s) name a section that does not exist; fix the citation or the \
         heading:\n{}",
        broken.len(),
        broken.join("\n")
    );
}
