//! Tidy: no import circle between the files of `src/store/` (the port, the fan-out, the memory
//! store and the PostgreSQL adapter under `pg/`), nor between the flags, their validation and
//! the wiring (`cli.rs`, `config.rs`, `wiring.rs`) of every binary: the apiserver's, the
//! gateway's (`gateway/src/{proxy,authz}/`) and the controllers'. A file imports another when its code (not
//! its comments, not its test module) names a path into it: `use super::x`, `use
//! crate::store::x::Y`, `super::x::f()`, or, in a `mod.rs`, `pub use x::Y` (a re-export is an
//! import too, which is why a facade `mod.rs` must not be imported back by its children).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path from the crate root (`["store", "pg", "tail"]`).
type ModPath = Vec<String>;

fn module_of(src: &Path, file: &Path) -> ModPath {
    let relative = file.strip_prefix(src).expect("a file under src");
    let mut path: ModPath = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    if path == ["lib"] {
        path.clear();
    }
    path
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments, string contents and its unit-test module.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            c => out.push(c),
        }
    }
    match out.find("#[cfg(test)]\nmod tests") {
        Some(at) => out[..at].to_string(),
        None => out,
    }
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let (prefix, inner) = (&tree[..open], &tree[open + 1..tree.len() - 1]);
    let mut parts = Vec::new();
    let (mut depth, mut current) = (0, String::new());
    for c in inner.chars() {
        match c {
            ',' if depth == 0 => parts.push(std::mem::take(&mut current)),
            '{' => {
                depth += 1;
                current.push(c);
            }
            '}' => {
                depth -= 1;
                current.push(c);
            }
            c => current.push(c),
        }
    }
    parts.push(current);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// The paths a file's code names: every `use` tree and every inline `crate::`/`super::` path.
fn paths_named(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(end) = rest.find(';') {
            paths.extend(expand(&rest[..end]));
        }
    }
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().next_back();
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            // `use super::{a, b}` is read as a use tree above; a bare `super::` names no file.
            let path = tail[..end].trim_end_matches(':');
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && path.contains("::") {
                paths.push(path.to_string());
            }
            rest = &rest[at + start.len()..];
        }
    }
    paths
}

/// The module file a path named in `here` leads into, if it is one of `modules`.
fn resolve(here: &ModPath, path: &str, modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base = here.clone();
    match segments.first() {
        Some(&"crate") => {
            base.clear();
            segments.remove(0);
        }
        Some(&"super") | Some(&"self") => {
            while let Some(&s) = segments.first() {
                match s {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                segments.remove(0);
            }
        }
        _ => {}
    }
    let mut best = None;
    let mut candidate = base;
    if modules.contains(&candidate) {
        best = Some(candidate.clone());
    }
    for segment in segments {
        candidate.push(segment.to_string());
        if modules.contains(&candidate) {
            best = Some(candidate.clone());
        }
    }
    best
}

/// Which of `files` each of them imports, by module path.
fn import_graph(src: &Path, files: &[PathBuf]) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let modules: BTreeMap<ModPath, &PathBuf> =
        files.iter().map(|f| (module_of(src, f), f)).collect();
    let known: BTreeSet<ModPath> = modules.keys().cloned().collect();
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (here, file) in &modules {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let targets = edges.entry(here.clone()).or_default();
        for path in paths_named(&code_of(&text)) {
            let first = path.split("::").next().unwrap_or_default();
            let relative_child = {
                let mut child = here.clone();
                child.push(first.to_string());
                known.contains(&child)
            };
            if !matches!(first, "crate" | "super" | "self") && !relative_child {
                continue;
            }
            if let Some(target) = resolve(here, &path, &known) {
                if &target != here {
                    targets.insert(target);
                }
            }
        }
    }
    edges
}

/// The circles of the import graph of `files`: its strongly connected components of more
/// than one file.
fn circles(src: &Path, files: &[PathBuf]) -> Vec<Vec<String>> {
    let edges = import_graph(src, files);
    // Tarjan's strongly connected components.
    struct Walk<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        found: Vec<Vec<String>>,
    }
    impl Walk<'_> {
        fn visit(&mut self, v: &ModPath) {
            let n = self.index.len();
            self.index.insert(v.clone(), n);
            self.low.insert(v.clone(), n);
            self.stack.push(v.clone());
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v.clone(), low);
                } else if self.stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v.clone(), low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    let done = &w == v;
                    component.push(w.join("::"));
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_store_has_no_import_circle() {
    let src = src();
    let mut files = Vec::new();
    rust_files(&src.join("store"), &mut files);
    assert!(files.len() > 10, "the store's files are found: {files:?}");
    assert_eq!(circles(&src, &files), Vec::<Vec<String>>::new());
}

/// Flags (`cli.rs`), their validation (`config.rs`) and the wiring (`wiring.rs`) of each
/// binary, under `dir` of a crate's `src`: no circle, and no import backwards (the flags
/// import neither their validation nor the wiring; the validation does not import the
/// wiring).
fn assert_flags_config_wiring_one_way(src: &Path, dir: &str) {
    let in_dir = |file: &str| src.join(dir).join(file);
    let files: Vec<PathBuf> = ["cli.rs", "config.rs", "wiring.rs"]
        .iter()
        .map(|f| in_dir(f))
        .collect();
    for file in &files {
        assert!(file.is_file(), "{} exists", file.display());
    }
    assert_eq!(circles(src, &files), Vec::<Vec<String>>::new());
    let module = |file: &str| module_of(src, &in_dir(file));
    let edges = import_graph(src, &files);
    let imports = |from: &str, to: &str| edges[&module(from)].contains(&module(to));
    for (from, to) in [
        ("cli.rs", "config.rs"),
        ("cli.rs", "wiring.rs"),
        ("config.rs", "wiring.rs"),
    ] {
        assert!(!imports(from, to), "{dir}/{from} imports {dir}/{to}");
    }
    assert!(
        imports("config.rs", "cli.rs"),
        "{dir}/config.rs validates the flags"
    );
    assert!(
        imports("wiring.rs", "config.rs"),
        "{dir}/wiring.rs runs the configuration"
    );
}

#[test]
fn flags_config_and_wiring_import_one_way() {
    assert_flags_config_wiring_one_way(&src(), "");
}

#[test]
fn the_gateway_binaries_import_flags_config_and_wiring_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/src");
    assert_flags_config_wiring_one_way(&src, "proxy");
    assert_flags_config_wiring_one_way(&src, "authz");
}

#[test]
fn the_controllers_import_flags_config_and_wiring_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../controllers/src");
    assert_flags_config_wiring_one_way(&src, "");
}

/// The check can fail: two files that name each other are one circle.
#[test]
fn a_circle_is_found() {
    let dir = std::env::temp_dir().join(format!("tidy-imports-{}", std::process::id()));
    let store = dir.join("store");
    std::fs::create_dir_all(&store).expect("a temporary directory");
    std::fs::write(store.join("mod.rs"), "mod a;\nmod b;\npub use a::A;\n").expect("writes");
    std::fs::write(
        store.join("a.rs"),
        "use super::b::B; // super::c\npub struct A;\n",
    )
    .expect("writes");
    std::fs::write(
        store.join("b.rs"),
        "pub struct B;\nfn f() { let _ = super::A; }\n",
    )
    .expect("writes");
    let mut files = Vec::new();
    rust_files(&store, &mut files);
    let found = circles(&dir, &files);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        found,
        vec![vec![
            "store".to_string(),
            "store::a".to_string(),
            "store::b".to_string()
        ]]
    );
}
