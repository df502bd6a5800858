//! The docs stay true to the code where a machine can tell:
//!
//! - every numbered invariant the code cites in a comment or message
//!   ("invariant" or "invariants" followed by numbers, under `src/` and
//!   `tests/`) is one that `docs/design.md` numbers;
//! - every relative link in `README.md` and `docs/*.md` reaches a file or
//!   folder of the repository, and a `#fragment` reaches a heading there;
//! - the README stays short and starts with the two commands scripts use.
#![allow(clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Docs other work of this round is writing, linked before they exist.
/// Empty this list once they are merged: a listed file that exists fails
/// the test, so the list only shrinks.
const NOT_YET_WRITTEN: &[&str] = &[];

/// The README's opening commands, exactly: CI and scripts run them.
const FIRST_COMMANDS: [&str; 2] = [
    "cargo run -- demo     # the main job, on the embedded default: SQLite + the built-in simulated providers, no API keys",
    "cargo test            # the tests (PostgreSQL tests run when ONEJOB_TEST_POSTGRES_URL is set; see below)",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_cited_invariant_is_numbered_in_docs_design() {
    let numbered = numbered_invariants(&read(&root().join("docs/design.md")));
    assert!(
        numbered.len() >= 8,
        "docs/design.md numbers only {numbered:?} under \"## Invariants\""
    );
    let expected: BTreeSet<u32> = (1..=numbered.len() as u32).collect();
    assert_eq!(
        numbered, expected,
        "the invariants are numbered 1, 2, 3, … without gaps"
    );
    let mut cited = 0;
    let mut unknown = Vec::new();
    for dir in ["src", "tests"] {
        for file in rust_files(&root().join(dir)) {
            let text = read(&file);
            for (line, n) in cited_invariants(&text) {
                cited += 1;
                if !numbered.contains(&n) {
                    let rel = file
                        .strip_prefix(root())
                        .unwrap_or(&file)
                        .display()
                        .to_string();
                    unknown.push(format!("{rel}:{line} cites invariant {n}"));
                }
            }
        }
    }
    assert!(
        cited > 20,
        "found only {cited} citations: is the scan broken?"
    );
    assert!(
        unknown.is_empty(),
        "citations of invariants docs/design.md does not number:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn every_relative_link_in_the_docs_reaches_a_file() {
    let mut docs = vec![root().join("README.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    in_docs.sort();
    assert!(in_docs.len() >= 6, "docs/ holds only {in_docs:?}");
    docs.extend(in_docs);
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = read(doc);
        let rel_doc = doc
            .strip_prefix(root())
            .unwrap_or(doc)
            .display()
            .to_string();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap_or(&root()).join(path)
            };
            let in_repo = normalise(file.strip_prefix(root()).unwrap_or(&file));
            if !file.exists() {
                if !NOT_YET_WRITTEN.contains(&in_repo.as_str()) {
                    broken.push(format!(
                        "{rel_doc}:{line}: {target} ({in_repo} does not exist)"
                    ));
                }
                continue;
            }
            if let Some(fragment) = fragment {
                if file.extension().is_some_and(|e| e == "md")
                    && !anchors(&read(&file)).contains(fragment)
                {
                    broken.push(format!(
                        "{rel_doc}:{line}: {target} (no heading #{fragment} in {in_repo})"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "found only {checked} relative links: is the scan broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    let written: Vec<_> = NOT_YET_WRITTEN
        .iter()
        .filter(|p| root().join(p).exists())
        .collect();
    assert!(
        written.is_empty(),
        "{written:?} exist now: take them off NOT_YET_WRITTEN (tests/docs.rs)"
    );
}

#[test]
fn the_readme_is_short_and_opens_with_the_two_commands() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; the rest belongs in docs/"
    );
    let first_block: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert_eq!(first_block, FIRST_COMMANDS, "the README's first code block");
}

/// The scanners on made-up text: each finds what it is for.
#[test]
fn the_scanners_find_citations_links_and_headings() {
    let text =
        "// Invariants 1 and 2: …\n/// see invariant 5, and\n/// invariants 3,\n/// 4 or\n/// 6.\n\
                // invariant\n// 7 here; an invariant of the store is not a citation";
    let found: Vec<(usize, u32)> = cited_invariants(text);
    assert_eq!(
        found,
        vec![(1, 1), (1, 2), (2, 5), (3, 3), (4, 4), (5, 6), (7, 7)]
    );

    let md = "# Top\n[a](docs/x.md#one) and `[b](not/a/link.md)`\n```\n[c](in/code.md)\n```\n\
              ## One: the `first`, part\n[d](#top) ![img](y.png)";
    assert_eq!(
        links(md),
        vec![
            (2, "docs/x.md#one".to_string()),
            (7, "#top".to_string()),
            (7, "y.png".to_string())
        ]
    );
    let headings = anchors(md);
    assert!(
        headings.contains("top") && headings.contains("one-the-first-part"),
        "{headings:?}"
    );

    let design =
        "## Invariants\n\n1. **One.** text\n   2. not a heading\n2. **Two.**\n\n## States\n3. no";
    assert_eq!(numbered_invariants(design), BTreeSet::from([1, 2]));
}

// ---------------------------------------------------------------------------

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The numbers of the list items under `## Invariants`.
fn numbered_invariants(design: &str) -> BTreeSet<u32> {
    design
        .lines()
        .skip_while(|l| l.trim() != "## Invariants")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| {
            let (n, rest) = l.split_once(". ")?;
            rest.starts_with("**").then(|| n.parse().ok()).flatten()
        })
        .collect()
}

/// (line, number) of every "invariant N" / "invariants N, M and K" in a
/// text, across comment lines (`//`, `///`, `//!` continue a citation).
fn cited_invariants(text: &str) -> Vec<(usize, u32)> {
    let lower = text.to_lowercase();
    let bytes = lower.as_bytes();
    let line_at = |i: usize| lower[..i].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find("invariant") {
        let start = from + at;
        let mut i = start + "invariant".len();
        from = i;
        if start > 0 && bytes[start - 1].is_ascii_alphanumeric() {
            continue;
        }
        if bytes.get(i) == Some(&b's') {
            i += 1;
        }
        // Numbers, joined by "," "and" "or" "–" and line breaks into the
        // next comment line.
        let separators = |i: &mut usize| {
            while *i < bytes.len()
                && (bytes[*i].is_ascii_whitespace() || b"/!,".contains(&bytes[*i]))
            {
                *i += 1;
            }
        };
        loop {
            let before = i;
            separators(&mut i);
            for joiner in ["and", "or", "to", "–", "-"] {
                let after = i + joiner.len();
                if lower[i..].starts_with(joiner)
                    && !bytes.get(after).is_some_and(u8::is_ascii_alphanumeric)
                {
                    i = after;
                    separators(&mut i);
                    break;
                }
            }
            let digits = lower[i..].bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || i == before {
                break;
            }
            if let Ok(n) = lower[i..i + digits].parse() {
                out.push((line_at(i), n));
            }
            i += digits;
        }
    }
    out
}

/// (line, target) of every inline Markdown link and image outside code.
fn links(md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in md.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut in_code = false;
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '`' => in_code = !in_code,
                ']' if !in_code && chars.get(i + 1) == Some(&'(') => {
                    let target: String = chars[i + 2..].iter().take_while(|c| **c != ')').collect();
                    let target = target.split_whitespace().next().unwrap_or("").to_string();
                    if !target.is_empty() {
                        out.push((n + 1, target));
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    out
}

/// The anchors GitHub makes of a Markdown file's headings: lower case,
/// punctuation but `-` and `_` dropped, spaces to `-`.
fn anchors(md: &str) -> BTreeSet<String> {
    let mut fenced = false;
    md.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced && l.starts_with('#')
        })
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

fn normalise(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    parts.join("/")
}
