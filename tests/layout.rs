//! The `# Layout` section of `src/lib.rs` lists every module from the top
//! down; a module may import only modules listed below it. This keeps the
//! list true and the imports pointing one way (no module imports one that
//! imports it back).

use std::collections::BTreeSet;
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
