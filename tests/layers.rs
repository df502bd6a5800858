//! The layers keep pointing one way (issue 23, step 4):
//!
//! ```text
//! domain ← store ← providers/contracts ← engine ← jobs ← http ← app ← cli
//! ```
//!
//! Read from the source, not from the compiler: every `use crate::…`,
//! `use super::…` and every `crate::…` / `super::…` path (a macro's
//! `$crate::…` too) in `src/**/*.rs`, comments and string literals left
//! out, is resolved to the file that defines the module it names. Then:
//!
//! - no file imports from a layer above its own ([`LAYERS`]);
//! - no two top-level modules import each other, directly or round a loop;
//! - no two files import each other, directly or round a loop, apart from a
//!   module's own files (a `mod.rs` and the files under it may use each
//!   other: that is how a module re-exports and shares its parts). The
//!   cycles left are listed in [`ALLOWED_CYCLES`], and that list only
//!   shrinks: a listed cycle that is gone fails the test until its entry
//!   is deleted.
//!
//! A new top-level module fails the test until it is given a layer.
#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::OnceLock;

/// Each layer and its top-level modules, lowest first. A file may import
/// from its own layer and the layers below it.
const LAYERS: &[(&str, &[&str])] = &[
    // Pure types and transitions, and the leaves every layer may use:
    // injected time, the process's metrics, logs and traces, and the job as
    // the API (and a webhook's body) shows it.
    (
        "domain",
        &["domain", "clock", "metrics", "telemetry", "views"],
    ),
    ("store", &["store"]),
    // What the engine runs against and by: provider adapters, contracts,
    // the simulated provider, the typed configuration, and webhook delivery
    // (which config names for its settings and the key its secrets are
    // sealed with).
    (
        "providers/contracts",
        &["providers", "contracts", "sim", "config", "webhooks"],
    ),
    ("engine", &["engine"]),
    // Accepting work: who the caller is (keys, tenants), the job, its replays.
    ("jobs", &["jobs", "keys", "tenants", "replays"]),
    ("http", &["http"]),
    ("app", &["app"]),
    ("cli", &["cli", "demo"]),
];

/// File cycles still to be removed, each a set of files under `src/`
/// (the whole strongly connected set) and what removes it. Delete an entry
/// when its cycle is gone: the test fails until you do.
const ALLOWED_CYCLES: &[(&[&str], &str)] = &[];

#[test]
fn every_top_level_module_has_a_layer() {
    let graph = src_graph();
    let placed: BTreeSet<&str> = LAYERS.iter().flat_map(|(_, m)| m.iter().copied()).collect();
    let found: BTreeSet<&str> = graph
        .files
        .values()
        .filter_map(|m| m.first())
        .map(String::as_str)
        .collect();
    let unplaced: Vec<_> = found.difference(&placed).collect();
    assert!(
        unplaced.is_empty(),
        "put these top-level modules in a layer of LAYERS (tests/layers.rs): {unplaced:?}"
    );
    let gone: Vec<_> = placed.difference(&found).collect();
    assert!(
        gone.is_empty(),
        "LAYERS names modules that no longer exist: {gone:?}"
    );
}

#[test]
fn no_file_imports_from_a_layer_above_its_own() {
    let graph = src_graph();
    let upward = upward_imports(graph);
    assert!(
        upward.is_empty(),
        "imports from a layer above the importer's own (layers, lowest first: {}):\n{}",
        LAYERS
            .iter()
            .map(|(l, _)| *l)
            .collect::<Vec<_>>()
            .join(" ← "),
        upward.join("\n")
    );
}

#[test]
fn no_two_top_level_modules_import_each_other() {
    let graph = src_graph();
    let cycles = module_cycles(graph);
    assert!(
        cycles.is_empty(),
        "top-level modules that import each other (directly or round a loop): {cycles:?}\n{}",
        graph.explain(|a, b| top(a) != top(b)
            && cycles
                .iter()
                .any(|c| c.contains(top(a)) && c.contains(top(b))))
    );
}

#[test]
fn no_two_files_import_each_other_beyond_the_listed_cycles() {
    let graph = src_graph();
    let found: BTreeSet<BTreeSet<String>> = file_cycles(graph).into_iter().collect();
    let allowed: BTreeSet<BTreeSet<String>> = ALLOWED_CYCLES
        .iter()
        .map(|(files, _)| files.iter().map(|f| f.to_string()).collect())
        .collect();
    let new: Vec<_> = found.difference(&allowed).collect();
    assert!(
        new.is_empty(),
        "files that import each other (directly or round a loop): {new:?}\n{}",
        graph.explain(|a, b| new.iter().any(|c| c.contains(a) && c.contains(b)))
    );
    let gone: Vec<_> = allowed.difference(&found).collect();
    assert!(
        gone.is_empty(),
        "these listed cycles are gone or changed shape: delete (or correct) their entry in \
         ALLOWED_CYCLES (tests/layers.rs): {gone:?}"
    );
}

/// The checks themselves, on a small made-up crate: each finds what it is
/// for, and comments and strings are not imports.
#[test]
fn the_checks_find_an_upward_import_and_a_cycle_but_not_a_comment() {
    let src = |files: &[(&str, &str)]| -> Vec<(String, String)> {
        files
            .iter()
            .map(|(p, s)| (p.to_string(), s.to_string()))
            .collect()
    };
    let clean = src(&[
        ("lib.rs", "pub mod domain; pub mod store; pub mod engine;"),
        (
            "domain/mod.rs",
            "pub mod job; pub use job::Job; // crate::engine is above\n\
             const S: &str = \"crate::store::x\"; const C: char = '\"';\n\
             const R: &str = r#\"use crate::engine::a; \"x\"\"#; const L: &'static str = \"\";",
        ),
        ("domain/job.rs", "use super::Job as _; pub struct Job;"),
        (
            "store/mod.rs",
            "use crate::domain::{self, job::{Job}};\n mod a { use super::super::domain::Job; }",
        ),
        (
            "engine/mod.rs",
            "pub mod a; pub mod b; fn f() { crate::store::go(); }",
        ),
        ("engine/a.rs", "use super::b::B; pub struct A;"),
        ("engine/b.rs", "pub struct B;"),
    ]);
    let graph = Graph::of(&clean);
    assert_eq!(upward_imports(&graph), Vec::<String>::new());
    assert!(module_cycles(&graph).is_empty());
    assert!(file_cycles(&graph).is_empty());
    assert!(graph.edges["store/mod.rs"].contains_key("domain/job.rs"));
    assert!(graph.edges["engine/mod.rs"].contains_key("store/mod.rs"));

    let mut broken = clean.clone();
    broken[1].1.push_str("\nuse crate::engine::a::A;");
    broken[6].1.push_str("\nfn g() -> super::a::A { todo!() }");
    let graph = Graph::of(&broken);
    let upward = upward_imports(&graph);
    assert_eq!(upward.len(), 1, "{upward:?}");
    assert!(
        upward[0].starts_with("src/domain/mod.rs:4 imports crate::engine::a::A"),
        "{upward:?}"
    );
    assert_eq!(
        module_cycles(&graph),
        vec![["domain", "engine", "store"]
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()]
    );
    let cycles = file_cycles(&graph);
    assert!(
        cycles.contains(
            &["engine/a.rs", "engine/b.rs"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        ),
        "{cycles:?}"
    );
}

// ---------------------------------------------------------------------------

/// The graph of `src/`, read once for all the tests.
fn src_graph() -> &'static Graph {
    static GRAPH: OnceLock<Graph> = OnceLock::new();
    GRAPH.get_or_init(|| Graph::of(&read_src()))
}

/// Every `.rs` file under `src/` (but the binary's `main.rs`, which reaches
/// the library as `onejob::`), as (path under `src/`, text).
fn read_src() -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.map(|e| e.path()).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .to_string_lossy()
                    .replace('\\', "/");
                if rel != "main.rs" {
                    let text =
                        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
                    out.push((rel, text));
                }
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    assert!(
        out.len() > 50,
        "read only {} files under {}",
        out.len(),
        root.display()
    );
    out
}

type Module = Vec<String>;

/// Where an import was written: line and the path as resolved.
#[derive(Debug, Clone)]
struct Site {
    line: usize,
    path: String,
}

struct Graph {
    /// Each file's module path (`crate::` left off).
    files: BTreeMap<String, Module>,
    /// file → file it imports from → the first place it does.
    edges: BTreeMap<String, BTreeMap<String, Site>>,
}

impl Graph {
    fn of(sources: &[(String, String)]) -> Graph {
        let mut files: BTreeMap<String, Module> = sources
            .iter()
            .map(|(p, _)| (p.clone(), module_of(p)))
            .collect();
        // `#[path = "x.rs"] mod name;` puts x.rs at `<declaring module>::name`.
        for (p, text) in sources {
            for (target, name) in path_attributes(text) {
                let dir = p.rsplit_once('/').map_or("", |(d, _)| d);
                let target = if dir.is_empty() {
                    target
                } else {
                    format!("{dir}/{target}")
                };
                if files.contains_key(&target) {
                    let mut module = files[p].clone();
                    module.push(name);
                    files.insert(target, module);
                }
            }
        }
        let mut modules: BTreeMap<Module, String> =
            files.iter().map(|(f, m)| (m.clone(), f.clone())).collect();
        let mut macros: BTreeMap<String, String> = BTreeMap::new();
        let mut uses: Vec<(String, Vec<Written>)> = Vec::new();
        for (p, text) in sources {
            let tokens = tokens(&blank(text));
            let scan = scan(&tokens);
            for inline in &scan.inline_modules {
                let mut module = files[p].clone();
                module.extend(inline.iter().cloned());
                modules.entry(module).or_insert_with(|| p.clone());
            }
            for name in scan.exported_macros {
                macros.insert(name, p.clone());
            }
            uses.push((p.clone(), scan.paths));
        }
        let mut edges: BTreeMap<String, BTreeMap<String, Site>> = BTreeMap::new();
        for (p, paths) in uses {
            let entry = edges.entry(p.clone()).or_default();
            for (line, inline, path) in paths {
                let mut here = files[&p].clone();
                here.extend(inline);
                let Some(absolute) = absolute(&here, &path) else {
                    continue;
                };
                let target = match absolute.as_slice() {
                    [name] if macros.contains_key(name) => Some(macros[name].clone()),
                    _ => (0..=absolute.len())
                        .rev()
                        .find_map(|n| modules.get(&absolute[..n]).cloned()),
                };
                if let Some(target) = target.filter(|t| *t != p) {
                    let path = format!("crate::{}", absolute.join("::"));
                    entry.entry(target).or_insert(Site { line, path });
                }
            }
        }
        Graph { files, edges }
    }

    /// The imports between files that `pick` selects, one a line.
    fn explain(&self, pick: impl Fn(&str, &str) -> bool) -> String {
        let mut out = String::new();
        for (from, targets) in &self.edges {
            for (to, site) in targets {
                if pick(from, to) && !related(&self.files[from], &self.files[to]) {
                    out.push_str(&format!(
                        "  src/{from}:{} imports {} (src/{to})\n",
                        site.line, site.path
                    ));
                }
            }
        }
        out
    }
}

fn module_of(path: &str) -> Module {
    let stem = path.trim_end_matches(".rs");
    let mut parts: Module = stem.split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The top-level module a file belongs to ("" for `lib.rs`).
fn top(file: &str) -> &str {
    let first = file.split('/').next().unwrap_or("");
    first.trim_end_matches(".rs")
}

/// One module path is the other's or lies inside it.
fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, members)| members.contains(&module))
}

fn upward_imports(graph: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (from, targets) in &graph.edges {
        for (to, site) in targets {
            let (Some(a), Some(b)) = (layer_of(top(from)), layer_of(top(to))) else {
                continue;
            };
            if b > a {
                out.push(format!(
                    "src/{from}:{} imports {} (layer {}) from layer {}",
                    site.line, site.path, LAYERS[b].0, LAYERS[a].0
                ));
            }
        }
    }
    out
}

fn module_cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in &graph.edges {
        for to in targets.keys() {
            let (a, b) = (top(from), top(to));
            if !a.is_empty() && !b.is_empty() && a != b {
                edges
                    .entry(a.to_string())
                    .or_default()
                    .insert(b.to_string());
            }
        }
    }
    cycles(&edges)
}

fn file_cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in &graph.edges {
        for to in targets.keys() {
            if !related(&graph.files[from], &graph.files[to]) {
                edges.entry(from.clone()).or_default().insert(to.clone());
            }
        }
    }
    cycles(&edges)
}

/// The strongly connected sets of more than one node (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.stack.contains(&w.as_str()) {
                    let iw = self.index[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut set = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    set.insert(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    self.out.push(set);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

/// A path made absolute from the module it is written in, `crate::` left
/// off; `None` for a path that starts elsewhere (another crate, a local).
fn absolute(here: &[String], path: &[String]) -> Option<Module> {
    let mut out = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self" | "super") => here.to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        out.pop();
        while rest.first().is_some_and(|s| s == "super") {
            out.pop();
            rest = &rest[1..];
        }
    }
    out.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(out)
}

/// `#[path = "x.rs"] … mod name` pairs, from the raw text.
fn path_attributes(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[path = \"") {
        rest = &rest[at + 10..];
        let Some(end) = rest.find('"') else { break };
        let target = rest[..end].to_string();
        let Some(m) = rest.find("mod ") else { break };
        let name: String = rest[m + 4..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        out.push((target, name));
    }
    out
}

/// The text with comments and string and char literals turned to spaces
/// (newlines kept, so lines still count).
fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let space = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        // An identifier character before, but the `b` of `br"…"`.
        let prev_ident =
            i > 0 && ident(c[i - 1]) && !(c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2])));
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    space(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if let Some(hashes) = (c[i] == 'r' && !prev_ident)
            .then(|| raw_string_hashes(&c[i + 1..]))
            .flatten()
        {
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            for _ in 0..hashes + 2 {
                out.push(' ');
                i += 1;
            }
            while i < c.len() && !c[i..].starts_with(&close) {
                space(&mut out, c[i]);
                i += 1;
            }
            for _ in 0..close.len().min(c.len() - i) {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    space(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && (c.get(i + 1) == Some(&'\\') || c.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\u{1F600}'); otherwise a lifetime.
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '\'' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// After the `r` of a raw string (`r"…"`, `r#"…"#`): how many `#` it has.
fn raw_string_hashes(after_r: &[char]) -> Option<usize> {
    let hashes = after_r.iter().take_while(|&&h| h == '#').count();
    (after_r.get(hashes) == Some(&'"')).then_some(hashes)
}

/// Identifiers (a macro's `$crate` is `crate`), `::`, and single-character
/// punctuation, each with its line.
fn tokens(text: &str) -> Vec<(usize, String)> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            out.push((line, word.trim_start_matches("r#").to_string()));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((line, "::".to_string()));
            i += 2;
        } else {
            out.push((line, ch.to_string()));
            i += 1;
        }
    }
    out
}

/// A path as written: (line, the inline modules it is written in, its segments).
type Written = (usize, Vec<String>, Vec<String>);

struct Scan {
    paths: Vec<Written>,
    /// `mod name { … }` blocks, each as the path of inline modules to it.
    inline_modules: Vec<Vec<String>>,
    /// `#[macro_export] macro_rules! name`: lives at `crate::name`.
    exported_macros: Vec<String>,
}

fn scan(t: &[(usize, String)]) -> Scan {
    let mut scan = Scan {
        paths: Vec::new(),
        inline_modules: Vec::new(),
        exported_macros: Vec::new(),
    };
    let is = |i: usize, s: &str| t.get(i).is_some_and(|(_, w)| w == s);
    let word = |i: usize| {
        t.get(i)
            .map(|(_, w)| w.as_str())
            .filter(|w| w.chars().all(|c| c.is_alphanumeric() || c == '_'))
    };
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut export_pending = false;
    let mut i = 0;
    while i < t.len() {
        let here: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
        match t[i].1.as_str() {
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "#" if is(i + 1, "[") && is(i + 2, "macro_export") => export_pending = true,
            "macro_rules" if is(i + 1, "!") => {
                if export_pending {
                    if let Some(name) = word(i + 2) {
                        scan.exported_macros.push(name.to_string());
                    }
                }
                export_pending = false;
            }
            "mod" if word(i + 1).is_some() && is(i + 2, "{") => {
                let name = t[i + 1].1.clone();
                let mut path = here.clone();
                path.push(name.clone());
                scan.inline_modules.push(path);
                inline.push((name, depth + 1));
                depth += 1;
                i += 3;
                continue;
            }
            "use" => {
                let line = t[i].0;
                let mut j = i + 1;
                let mut trees = Vec::new();
                use_tree(t, &mut j, Vec::new(), &mut trees);
                for path in trees {
                    scan.paths.push((line, here.clone(), path));
                }
                while j < t.len() && !is(j, ";") {
                    j += 1;
                }
                i = j + 1;
                continue;
            }
            "crate" | "super" if is(i + 1, "::") && !(i > 0 && is(i - 1, "::")) => {
                let line = t[i].0;
                let mut path = vec![t[i].1.clone()];
                let mut j = i + 1;
                while is(j, "::") && word(j + 1).is_some() {
                    path.push(t[j + 1].1.clone());
                    j += 2;
                }
                scan.paths.push((line, here.clone(), path));
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

/// The leaves of a use tree starting at `t[*i]`, each with `prefix` before it.
fn use_tree(t: &[(usize, String)], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    while let Some((_, tok)) = t.get(*i) {
        match tok.as_str() {
            "::" | "$" => *i += 1,
            "{" => {
                *i += 1;
                while t.get(*i).is_some_and(|(_, w)| w != "}") {
                    use_tree(t, i, path.clone(), out);
                    if t.get(*i).is_some_and(|(_, w)| w == ",") {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            "*" => {
                *i += 1;
                out.push(path);
                return;
            }
            w if w.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                path.push(w.to_string());
                *i += 1;
                if t.get(*i).is_some_and(|(_, w)| w == "::") {
                    continue;
                }
                if t.get(*i).is_some_and(|(_, w)| w == "as") {
                    *i += 2;
                }
                out.push(path);
                return;
            }
            _ => {
                // `;`, `,`, `}` with nothing before it, or a `$` of a macro.
                if !path.is_empty() {
                    out.push(path);
                }
                return;
            }
        }
    }
}
