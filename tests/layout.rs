//! The `# Layout` section of `src/lib.rs` lists every module from the top
//! down; a module may import only modules listed below it. This keeps the
//! list true and the imports pointing one way (no module imports one that
//! imports it back).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules the layout lists, in order (`- `name`: …` lines).
fn layout() -> Vec<String> {
    let lib = std::fs::read_to_string("src/lib.rs").unwrap();
    lib.lines()
        .skip_while(|l| !l.starts_with("//! # Layout"))
        .filter_map(|l| l.strip_prefix("//! - `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_owned()))
        .collect()
}

/// The `crate::<module>` names a source file (its tests left out) uses.
fn imports(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let name: String = code[at + 7..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_module_is_listed_and_imports_only_modules_below_it() {
    let order = layout();
    assert!(order.len() > 10, "no layout found in src/lib.rs: {order:?}");
    let mut all = Vec::new();
    files(Path::new("src"), &mut all);
    let mut problems = Vec::new();
    for path in all {
        let rel = path.strip_prefix("src").unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(at) = order.iter().position(|m| *m == top) else {
            problems.push(format!("{top} is not in the layout"));
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        for name in imports(&text) {
            if name == top {
                continue;
            }
            // Items of the crate root (`crate::run_with`) are not modules.
            let Some(dep) = order.iter().position(|m| *m == name) else {
                continue;
            };
            if dep < at {
                problems.push(format!(
                    "{} imports {name}, which is listed above {top}",
                    rel.display()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Code without comments: doc links name items a file does not use.
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a `use` tree or path expression starting at `code` names, each
/// as its segments: `a::{b, c::{d, self}}` is `a::b`, `a::c::d`, `a::c`.
fn paths_from(code: &str) -> Vec<Vec<String>> {
    fn walk(code: &[char], at: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            while code.get(*at).is_some_and(|c| c.is_whitespace()) {
                *at += 1;
            }
            if code.get(*at) == Some(&'{') {
                *at += 1;
                loop {
                    walk(code, at, path.clone(), out);
                    while code.get(*at).is_some_and(|c| c.is_whitespace()) {
                        *at += 1;
                    }
                    match code.get(*at) {
                        Some(',') => *at += 1,
                        Some('}') => {
                            *at += 1;
                            return;
                        }
                        _ => return,
                    }
                    while code.get(*at).is_some_and(|c| c.is_whitespace()) {
                        *at += 1;
                    }
                    if code.get(*at) == Some(&'}') {
                        *at += 1;
                        return;
                    }
                }
            }
            let start = *at;
            while code.get(*at).copied().is_some_and(is_ident) {
                *at += 1;
            }
            let name: String = code[start..*at].iter().collect();
            if name.is_empty() || name == "self" {
                out.push(path);
                return;
            }
            path.push(name);
            if code.get(*at) == Some(&':') && code.get(*at + 1) == Some(&':') {
                *at += 2;
            } else {
                out.push(path);
                return;
            }
        }
    }
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    walk(&chars, &mut 0, Vec::new(), &mut out);
    out
}

/// Every path a file's code names through `crate::` or `super::`, made
/// absolute (segments from the crate root) given the file's own module path.
fn absolute_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for (at, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == ':' || c == '$') {
            continue;
        }
        let mut rest = &code[at..];
        let mut base: Vec<String> = module.to_vec();
        if let Some(after) = rest.strip_prefix("crate::") {
            base.clear();
            rest = after;
        } else {
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
        }
        for path in paths_from(rest) {
            found.push(base.iter().cloned().chain(path).collect());
        }
    }
    found
}

/// The module path of a file under `src/`: `config/validate.rs` is
/// `config::validate`, `queue/mod.rs` is `queue`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

/// A circle in `edges` (node → the nodes it imports), if there is one.
fn find_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut circle = stack[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, edges, stack, done) {
                return Some(circle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(circle) = visit(node, edges, &mut Vec::new(), &mut done) {
            return Some(circle);
        }
    }
    None
}

/// Inside each module directory (`config/`, `queue/`, `queue/memory/`, ...)
/// the module's files import one another one way only: no two import each
/// other, directly or around a circle. A file's own directory counts as part
/// of it (`queue/memory/ranked_set.rs` is `memory` within `queue/`). The
/// module's own file (`mod.rs`, or `name.rs` beside `name/`) declares the
/// others and holds what they share, so it is not one of them; an item it
/// re-exports from one of them (`pub use record::LineRecord`) counts as that
/// file's.
#[test]
fn the_files_of_a_module_import_each_other_one_way() {
    let mut all = Vec::new();
    files(Path::new("src"), &mut all);
    let modules: Vec<(Vec<String>, String)> = all
        .iter()
        .map(|path| {
            let rel = path.strip_prefix("src").unwrap();
            (
                module_of(rel),
                code_of(&std::fs::read_to_string(path).unwrap()),
            )
        })
        .collect();
    let mut dirs = Vec::new();
    fn dirs_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.push(path.clone());
                dirs_under(&path, out);
            }
        }
    }
    dirs_under(Path::new("src"), &mut dirs);
    assert!(dirs.len() >= 5, "module directories under src/: {dirs:?}");
    let mut circles = Vec::new();
    for dir in dirs {
        let rel = dir.strip_prefix("src").unwrap();
        let base: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        // Items the module's own file re-exports from one of its files.
        let mut reexported: BTreeMap<String, String> = BTreeMap::new();
        if let Some((_, code)) = modules.iter().find(|(m, _)| *m == base) {
            for (at, _) in code.match_indices("use ") {
                if code[..at].chars().next_back().is_some_and(is_ident) {
                    continue;
                }
                for path in paths_from(&code[at + 4..]) {
                    if let [child, .., item] = path.as_slice() {
                        reexported.insert(item.clone(), child.clone());
                    }
                }
            }
        }
        let members: BTreeSet<String> = modules
            .iter()
            .filter(|(m, _)| m.len() > base.len() && m.starts_with(&base))
            .map(|(m, _)| m[base.len()].clone())
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, code) in &modules {
            if !(module.len() > base.len() && module.starts_with(&base)) {
                continue;
            }
            let from = &module[base.len()];
            for path in absolute_paths(code, module) {
                if path.len() <= base.len() || !path.starts_with(&base) {
                    continue;
                }
                let name = &path[base.len()];
                let to = if members.contains(name) {
                    name
                } else if let Some(child) = reexported.get(name).filter(|c| members.contains(*c)) {
                    child
                } else {
                    continue;
                };
                if to != from {
                    edges.entry(from.clone()).or_default().insert(to.clone());
                }
            }
        }
        if let Some(circle) = find_circle(&edges) {
            circles.push(format!("src/{}/: {}", rel.display(), circle.join(" → ")));
        }
    }
    assert!(
        circles.is_empty(),
        "files that import each other:\n{}",
        circles.join("\n")
    );
}
