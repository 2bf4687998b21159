//! docs/architecture.md names files, directories and items of the code; each claim of that
//! kind is checked here against the tree, so a rename or a move that leaves the page behind
//! fails the tests instead of leaving a page that describes code that is gone.
//!
//! - every `name.rs` / `name.md` / `name.sh` / `name.go` (with or without a directory part)
//!   is a file of the repository whose path ends with it;
//! - every directory of the layer tree (`name/` in its left column) is a directory of the
//!   repository whose path ends with it;
//! - every `Type::item` path in backticks resolves: `Type` (or the module) is defined in the
//!   workspace's Rust sources and `item` is defined there too (a function, type, constant,
//!   module, macro or enum variant);
//! - every `CONST_NAME` and `macro!` in backticks is defined.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every path of the repository (relative, `/`-separated), directories with a trailing `/`,
/// without build output, VCS state or installed packages.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if matches!(
                name.as_str(),
                "target" | ".git" | "node_modules" | ".dev" | ".local"
            ) {
                continue;
            }
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            // Symbolic links (a worktree's `target`) are not followed.
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                out.push(format!("{rel}/"));
                stack.push(path);
            } else if kind.is_file() {
                out.push(rel);
            }
        }
    }
    out
}

fn ends_with_path(path: &str, suffix: &str) -> bool {
    path == suffix || path.ends_with(&format!("/{suffix}"))
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Spans between backticks.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Words that look like file names with one of the checked extensions.
fn file_mentions(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    // URLs name other sites' files.
    let text: Vec<&str> = text
        .split_whitespace()
        .filter(|w| !w.contains("://"))
        .collect();
    let text = text.join(" ");
    for word in text.split(|c: char| !(is_ident_char(c) || matches!(c, '.' | '/' | '-'))) {
        let word = word.trim_matches(|c| c == '.' || c == '/');
        if [".rs", ".md", ".sh", ".go"]
            .iter()
            .any(|ext| word.ends_with(ext))
        {
            found.insert(word.to_string());
        }
    }
    found
}

/// The layer tree: the first fenced block after `## Layers`.
fn layer_tree(doc: &str) -> &str {
    let after = &doc[doc.find("## Layers").expect("a Layers section")..];
    let start = after.find("```").expect("a fenced layer tree") + 3;
    let end = start + after[start..].find("```").expect("the fence closes");
    &after[start..end]
}

/// Directories named in the tree's left column, joined to the root they sit under
/// (`store/pg/` under `apiserver/src/` → `apiserver/src/store/pg/`).
fn tree_directories(tree: &str) -> Vec<String> {
    let mut root = String::new();
    let mut dirs = Vec::new();
    for line in tree.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let indented = line.starts_with(' ');
        // The left column ends at the first run of two spaces.
        let left = line.trim_start();
        let left = left.split("  ").next().unwrap_or("").trim();
        for item in left.split(", ") {
            let item = item.trim();
            if !item.ends_with('/') {
                continue;
            }
            if indented {
                dirs.push(format!("{root}{item}"));
            } else {
                root = item.to_string();
                dirs.push(item.to_string());
            }
        }
    }
    dirs
}

struct Sources {
    text: String,
}

impl Sources {
    fn load(paths: &[String], root: &Path) -> Self {
        let mut text = String::new();
        for path in paths.iter().filter(|p| p.ends_with(".rs")) {
            text.push_str(&std::fs::read_to_string(root.join(path)).unwrap());
            text.push('\n');
        }
        Self { text }
    }

    /// Whether `name` is defined: an item, a macro, a module or an enum variant.
    fn defines(&self, name: &str) -> bool {
        const ITEMS: &[&str] = &[
            "fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "mod ",
        ];
        let word_at = |i: usize, len: usize| {
            let before = self.text[..i].chars().next_back();
            let after = self.text[i + len..].chars().next();
            !before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char)
        };
        let mut at = 0;
        while let Some(found) = self.text[at..].find(name) {
            let i = at + found;
            at = i + name.len();
            if !word_at(i, name.len()) {
                continue;
            }
            let line_start = self.text[..i].rfind('\n').map_or(0, |n| n + 1);
            let before = &self.text[line_start..i];
            let rest = self.text[i + name.len()..].trim_start();
            if ITEMS.iter().any(|item| before.ends_with(item)) || before.ends_with("macro_rules! ")
            {
                return true;
            }
            // An enum variant: alone at the start of its line, then `,` `(` `{` or `=`.
            if before.trim().is_empty()
                && name.starts_with(|c: char| c.is_ascii_uppercase())
                && rest.starts_with([',', '(', '{', '='])
            {
                return true;
            }
        }
        false
    }
}

fn is_path(span: &str) -> bool {
    let span = span.strip_suffix('!').unwrap_or(span);
    !span.is_empty()
        && span
            .split("::")
            .all(|seg| !seg.is_empty() && seg.chars().all(is_ident_char))
        && !span.starts_with(|c: char| c.is_ascii_digit())
}

/// What the page claims, checked; every failure listed at once.
fn problems(doc: &str, paths: &[String], sources: &Sources) -> Vec<String> {
    let mut problems = Vec::new();
    for file in file_mentions(doc) {
        if !paths.iter().any(|p| ends_with_path(p, &file)) {
            problems.push(format!("no file {file}"));
        }
    }
    for dir in tree_directories(layer_tree(doc)) {
        if !paths.iter().any(|p| ends_with_path(p, &dir)) {
            problems.push(format!("no directory {dir}"));
        }
    }
    for span in backticked(doc) {
        if !is_path(span) {
            continue;
        }
        if let Some(name) = span.strip_suffix('!') {
            if !sources.defines(name) {
                problems.push(format!("no macro {span}"));
            }
            continue;
        }
        let segments: Vec<&str> = span.split("::").collect();
        if segments.len() == 1 {
            let name = segments[0];
            // SCREAMING_CASE with an underscore is a constant of ours (plain capitals are
            // protocol words: MODIFIED, COMMIT).
            if name.contains('_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && !sources.defines(name)
            {
                problems.push(format!("no constant {name}"));
            }
            continue;
        }
        for segment in segments {
            // A crate or module named by its directory (`controllers::mcpserver`) counts.
            let module = paths.iter().any(|p| {
                ends_with_path(p, &format!("{segment}/"))
                    || ends_with_path(p, &format!("{segment}.rs"))
            });
            if !module && !sources.defines(segment) {
                problems.push(format!("`{span}`: {segment} is not defined"));
            }
        }
    }
    problems
}

#[test]
fn architecture_names_only_what_exists() {
    let root = repo();
    let paths = tree(&root);
    let sources = Sources::load(&paths, &root);
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let problems = problems(&doc, &paths, &sources);
    assert!(
        problems.is_empty(),
        "docs/architecture.md is behind the code:\n  {}",
        problems.join("\n  ")
    );
}

/// The checks themselves fail on a page that names what is not there.
#[test]
fn a_page_naming_what_is_gone_fails() {
    let root = repo();
    let paths = tree(&root);
    let sources = Sources::load(&paths, &root);
    let doc = "## Layers\n```\napiserver/src/\n  gone/   a directory that is not there\n```\n\
               The handler lives in `http/vanished.rs`; `Store::no_such_method` answers, \
               `serve_nothing!` routes and `NO_SUCH_CONSTANT` bounds it. `Store::create` is real.\n";
    let found = problems(doc, &paths, &sources);
    assert_eq!(
        found,
        [
            "no file http/vanished.rs",
            "no directory apiserver/src/gone/",
            "`Store::no_such_method`: no_such_method is not defined",
            "no macro serve_nothing!",
            "no constant NO_SUCH_CONSTANT",
        ],
        "{found:?}"
    );
}
