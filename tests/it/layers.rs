//! The layout's two checks over `src/`: imports run one way (README, "Code layout"), and no file
//! grows past what one can read in one sitting.
//!
//! Every `crate::<part>` path is found (`use crate::a::b`, `use crate::{a::b, c}` groups, inline
//! paths like `crate::backends::slurm::X`, and `$crate::` in macros) with comments and string
//! literals ignored. `super::` paths are not followed: none climbs out of its part today.
//! Test code (a `#[cfg(test)] mod … { … }`, or a `…tests.rs` file) may also use the simulated
//! world, `dryrun`.

use std::path::{Path, PathBuf};

/// Which parts each part may import besides itself. `lib.rs` and `main.rs` are exempt.
const ALLOWED: &[(&str, &[&str])] = &[
    ("app", &["http", "intake", "dryrun", "flows", "doctor", "engine", "backends", "domain", "effects"]),
    ("doctor", &["backends", "domain", "effects"]),
    ("http", &["intake", "dryrun", "flows", "engine", "backends", "domain", "effects"]),
    ("intake", &["flows", "engine", "backends", "domain", "effects"]),
    ("dryrun", &["flows", "engine", "backends", "domain", "effects"]),
    ("flows", &["engine", "backends", "domain", "effects"]),
    ("engine", &["effects"]),
    ("backends", &["domain", "effects"]),
    ("domain", &[]),
    ("effects", &[]),
];

/// What test code may import besides [`ALLOWED`].
const ALLOWED_IN_TESTS: &[&str] = &["dryrun"];

const MAX_LINES: usize = 400;

/// One `crate::<top>` reference: the line (1-based) where `<top>` is written, `<top>`, and
/// whether it is inside a `#[cfg(test)]` module.
#[derive(Debug, PartialEq)]
struct Ref {
    line: usize,
    top: String,
    in_test: bool,
}

/// The character ranges of `#[cfg(test)] mod name { … }` blocks in stripped source.
fn test_blocks(c: &[char]) -> Vec<std::ops::Range<usize>> {
    let text: String = c.iter().collect();
    let mut blocks = Vec::new();
    for (byte, _) in text.match_indices("#[cfg(test)]") {
        let at = text[..byte].chars().count() + "#[cfg(test)]".len();
        let Some(open) = (at..c.len()).find(|&k| c[k] == '{' || c[k] == ';') else { continue };
        let head: String = c[at..open].iter().collect();
        if c[open] == ';' || !head.split_whitespace().any(|w| w == "mod") {
            continue;
        }
        let mut depth = 0;
        for (k, &ch) in c.iter().enumerate().skip(open) {
            depth += i32::from(ch == '{') - i32::from(ch == '}');
            if depth == 0 {
                blocks.push(open..k + 1);
                break;
            }
        }
    }
    blocks
}

/// The source with comments and string/char literals blanked out (newlines kept, so lines still count).
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (at(i + 1) == '"' || at(i + 1) == '#') && !ident_char(at(i.wrapping_sub(1))) {
            // A raw string r"…" or r#"…"#; `r#ident` (a raw identifier) is left alone.
            let mut j = i + 1;
            while at(j) == '#' {
                j += 1;
            }
            if at(j) != '"' {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let rest: String = c[j + 1..].iter().collect();
            let end = rest.find(&close).map_or(c.len(), |k| j + 1 + rest[..k].chars().count() + close.len());
            for &ch in &c[i..end] {
                blank(&mut out, ch);
            }
            i = end;
        } else if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            if i < c.len() {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal ('x', '\n', '\''); a lifetime ('a) has no closing quote.
            let end = if at(i + 1) == '\\' {
                (i + 3..c.len()).find(|&k| c[k] == '\'').map_or(c.len(), |k| k + 1)
            } else {
                i + 3
            };
            for &ch in &c[i..end.min(c.len())] {
                blank(&mut out, ch);
            }
            i = end;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn ident_char(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// Every `crate::<top>` path in a file's source.
fn crate_refs(src: &str) -> Vec<Ref> {
    let c: Vec<char> = strip(src).chars().collect();
    let tests = test_blocks(&c);
    let in_test = |k: usize| tests.iter().any(|r| r.contains(&k));
    let line_at = |k: usize| 1 + c[..k].iter().filter(|&&ch| ch == '\n').count();
    let skip_ws = |mut k: usize| {
        while k < c.len() && c[k].is_whitespace() {
            k += 1;
        }
        k
    };
    let ident = |k: usize| {
        let mut e = k;
        while e < c.len() && ident_char(c[e]) {
            e += 1;
        }
        (c[k..e].iter().collect::<String>(), e)
    };
    let mut refs = Vec::new();
    let mut i = 0;
    while i + 5 <= c.len() {
        let word = c[i..i + 5].iter().collect::<String>() == "crate";
        let before_ok = i == 0 || !ident_char(c[i - 1]);
        let after_ok = !ident_char(c.get(i + 5).copied().unwrap_or(' '));
        if !(word && before_ok && after_ok) {
            i += 1;
            continue;
        }
        let mut k = skip_ws(i + 5);
        if c.get(k) != Some(&':') || c.get(k + 1) != Some(&':') {
            i += 5;
            continue;
        }
        k = skip_ws(k + 2);
        if c.get(k) == Some(&'{') {
            // A group: the first segment of each item at depth one is a top.
            let mut depth = 1;
            let mut item_start = true;
            k += 1;
            while k < c.len() && depth > 0 {
                let ch = c[k];
                if ch == '{' {
                    depth += 1;
                    item_start = false;
                } else if ch == '}' {
                    depth -= 1;
                } else if ch == ',' && depth == 1 {
                    item_start = true;
                } else if item_start && ident_char(ch) {
                    let (name, e) = ident(k);
                    if name != "self" {
                        refs.push(Ref { line: line_at(k), top: name, in_test: in_test(k) });
                    }
                    item_start = false;
                    k = e;
                    continue;
                } else if !ch.is_whitespace() {
                    item_start = false;
                }
                k += 1;
            }
        } else {
            let (name, _) = ident(k);
            if !name.is_empty() {
                refs.push(Ref { line: line_at(k), top: name, in_test: in_test(k) });
            }
        }
        i = k.max(i + 5);
    }
    refs
}

/// The part a file belongs to (`src/<part>/…` or `src/<part>.rs`); `None` for `lib.rs` and `main.rs`.
fn part_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if rel.components().count() > 1 {
        return Some(first);
    }
    let stem = first.strip_suffix(".rs")?;
    (stem != "lib" && stem != "main").then(|| stem.to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<(PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.strip_prefix(&src).unwrap().to_path_buf(), text)
        })
        .collect()
}

/// Every `file:line` that imports against [`ALLOWED`].
fn violations(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (rel, text) in files {
        let Some(part) = part_of(rel) else { continue };
        let allowed = ALLOWED
            .iter()
            .find(|(p, _)| *p == part)
            .unwrap_or_else(|| panic!("src/{}: part `{part}` is missing from ALLOWED", rel.display()))
            .1;
        let test_file = rel.file_stem().is_some_and(|s| s.to_string_lossy().ends_with("tests"));
        for r in crate_refs(text) {
            let in_test = r.in_test || test_file;
            if r.top == part || allowed.contains(&r.top.as_str()) || in_test && ALLOWED_IN_TESTS.contains(&&*r.top) {
                continue;
            }
            let what = if ALLOWED.iter().any(|(p, _)| *p == r.top) { "" } else { " (an item at the crate root)" };
            found.push(format!("src/{}:{}: {part} imports crate::{}{what}", rel.display(), r.line, r.top));
        }
    }
    found
}

#[test]
fn imports_run_one_way() {
    let found = violations(&sources());
    assert!(found.is_empty(), "{} import(s) against the direction:\n{}", found.len(), found.join("\n"));
}

#[test]
fn no_file_is_too_long() {
    let long: Vec<String> = sources()
        .iter()
        .map(|(rel, text)| (rel, text.lines().count()))
        .filter(|&(_, n)| n > MAX_LINES)
        .map(|(rel, n)| format!("src/{}: {n} lines", rel.display()))
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines:\n{}", long.join("\n"));
}

fn tops(src: &str) -> Vec<(usize, &'static str)> {
    crate_refs(src).into_iter().map(|r| (r.line, &*r.top.leak())).collect()
}

#[test]
fn parser_reads_uses_groups_and_inline_paths() {
    assert_eq!(tops("use crate::engine::Job;"), [(1, "engine")]);
    assert_eq!(tops("use crate :: engine;"), [(1, "engine")]);
    assert_eq!(
        tops("use crate::{\n    flows::x,\n    domain::{names::{A, B}, tenants},\n    self,\n};"),
        [(2, "flows"), (3, "domain")]
    );
    assert_eq!(tops("pub(crate) use crate::{a::{b::{c}}, d::{e, f::g}};"), [(1, "a"), (1, "d")]);
    assert_eq!(tops("fn f() -> crate::backends::slurm::X { crate::domain::y() }"), [(1, "backends"), (1, "domain")]);
    assert_eq!(tops("macro_rules! m { () => { $crate::flows::z } }"), [(1, "flows")]);
    assert_eq!(tops("let c = crate_name::x; pub(crate) fn f() {} mycrate::y"), []);
}

#[test]
fn parser_ignores_comments_and_strings() {
    let src = r####"
// use crate::app::x;
/// see [`crate::http::y`]
/* use crate::intake::z; /* nested crate::dryrun */ still crate::app */
let s = "crate::app::q";
let r = r#"crate::app::"q""#;
let c = '"'; let l: &'a str = "x"; use crate::effects::E;
"####;
    assert_eq!(tops(src), [(7, "effects")]);
}

#[test]
fn parser_knows_test_modules() {
    let src = "use crate::a::x;\n#[cfg(test)]\nmod tests {\n    fn f() { if x { crate::b::y() } }\n}\n#[cfg(test)]\nmod t;\nuse crate::c::z;";
    let got: Vec<(String, bool)> = crate_refs(src).into_iter().map(|r| (r.top, r.in_test)).collect();
    assert_eq!(got, [("a".into(), false), ("b".into(), true), ("c".into(), false)]);
}

#[test]
fn check_flags_an_import_up() {
    let files = vec![
        (PathBuf::from("engine/store.rs"), "use crate::effects::E;\nuse crate::flows::F;".to_string()),
        (PathBuf::from("backends/slurm/batch.rs"), "fn f() { crate::engine::x() }".to_string()),
        (PathBuf::from("domain.rs"), "use crate::domain::names;".to_string()),
        (PathBuf::from("lib.rs"), "use crate::app::run;".to_string()),
        (
            PathBuf::from("flows/x.rs"),
            "#[cfg(test)]\nmod tests {\n    use crate::dryrun::R;\n}\nuse crate::dryrun::S;".into(),
        ),
        (PathBuf::from("flows/parse_tests.rs"), "use crate::dryrun::R;\nuse crate::app::A;".into()),
    ];
    assert_eq!(
        violations(&files),
        [
            "src/engine/store.rs:2: engine imports crate::flows",
            "src/backends/slurm/batch.rs:1: backends imports crate::engine",
            "src/flows/x.rs:5: flows imports crate::dryrun",
            "src/flows/parse_tests.rs:2: flows imports crate::app",
        ]
    );
}
