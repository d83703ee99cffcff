//! CONTRIBUTING.md's map of the broker, held against the code so that it cannot drift: the
//! `text credbroker-layers` block lists the layers of `broker/src` from the top down, each with
//! its modules. Every layer and module listed exists, every one that exists is listed, and no
//! shipped code imports a layer above its own (`crate::<layer>` paths outside comments and
//! test modules).

use std::collections::BTreeSet;
use std::path::Path;

use credbroker_tests::doc_blocks::{blocks_of, repo_root};

/// One line of the map: a layer and the modules it declares (`*`: not listed one by one).
#[derive(Debug)]
struct Layer {
    name: String,
    modules: Option<BTreeSet<String>>,
}

/// The map's layers, from the ground up.
fn map(root: &Path) -> Vec<Layer> {
    let blocks: Vec<_> = blocks_of(root, "CONTRIBUTING.md")
        .into_iter()
        .filter(|b| b.kind.as_deref() == Some("credbroker-layers"))
        .collect();
    assert_eq!(
        blocks.len(),
        1,
        "CONTRIBUTING.md needs exactly one ```text credbroker-layers block"
    );
    let mut layers: Vec<Layer> = blocks[0]
        .body
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next().expect("a layer name").to_owned();
            let rest: Vec<&str> = words.collect();
            let modules = (rest != ["*"]).then(|| rest.iter().map(|m| (*m).to_owned()).collect());
            Layer { name, modules }
        })
        .collect();
    layers.reverse();
    layers
}

/// The modules a file declares (`mod x;` / `pub mod x;`, at the start of a line), but its
/// test module.
fn declared_modules(source: &str) -> BTreeSet<String> {
    source
        .lines()
        .filter_map(|l| {
            let l = l
                .trim_start_matches("pub ")
                .trim_start_matches("pub(crate) ");
            l.strip_prefix("mod ")?.strip_suffix(';').map(str::to_owned)
        })
        .filter(|m| m != "tests")
        .collect()
}

/// A file's shipped code: without comments and without its `#[cfg(test)] mod tests { … }`
/// (rustfmt's layout: the module ends at the first unindented `}`).
fn shipped(source: &str) -> String {
    let mut out = Vec::new();
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "#[cfg(test)]" && lines.peek() == Some(&"mod tests {") {
            let _ = lines.by_ref().find(|l| *l == "}");
            continue;
        }
        out.push(line.split("//").next().unwrap_or(""));
    }
    out.join("\n")
}

/// The layers a file's shipped code names through `crate::<layer>`.
fn imported_layers(source: &str, layers: &[Layer]) -> BTreeSet<usize> {
    let code = shipped(source);
    layers
        .iter()
        .enumerate()
        .filter(|(_, layer)| {
            let path = format!("crate::{}", layer.name);
            code.match_indices(&path).any(|(at, _)| {
                !code[at + path.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
            })
        })
        .map(|(i, _)| i)
        .collect()
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .flatten()
        {
            let path = entry.path();
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

#[test]
fn the_map_lists_every_layer_and_module_the_broker_has() {
    let root = repo_root();
    let src = root.join("broker/src");
    let layers = map(&root);
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("broker/src/lib.rs");
    let listed: BTreeSet<String> = layers.iter().map(|l| l.name.clone()).collect();
    assert_eq!(
        declared_modules(&lib),
        listed,
        "broker/src/lib.rs's modules against CONTRIBUTING.md's layers"
    );
    for layer in &layers {
        let Some(modules) = &layer.modules else {
            continue;
        };
        let file = src.join(format!("{}.rs", layer.name));
        let source =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(
            &declared_modules(&source),
            modules,
            "broker/src/{}.rs's modules against CONTRIBUTING.md's line for {}",
            layer.name,
            layer.name
        );
    }
}

#[test]
fn no_shipped_code_imports_a_layer_above_its_own() {
    let root = repo_root();
    let src = root.join("broker/src");
    let layers = map(&root);
    let mut up = Vec::new();
    let mut seen = 0;
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).expect("under broker/src");
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let name = first.trim_end_matches(".rs");
        let Some(own) = layers.iter().position(|l| l.name == name) else {
            continue;
        };
        if rel.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        seen += 1;
        let source =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for above in imported_layers(&source, &layers)
            .into_iter()
            .filter(|&i| i > own)
        {
            up.push(format!(
                "broker/src/{} ({}) imports crate::{}",
                rel.display(),
                layers[own].name,
                layers[above].name
            ));
        }
    }
    assert!(seen > 50, "only {seen} files read under broker/src");
    assert!(
        up.is_empty(),
        "imports pointing up a layer:\n{}",
        up.join("\n")
    );
}

#[test]
fn the_ground_layer_imports_nothing_above_it() {
    let root = repo_root();
    let layers = map(&root);
    let base = &layers[0];
    for module in base
        .modules
        .as_ref()
        .expect("the ground layer lists its modules")
    {
        let file = root.join(format!("broker/src/{}/{module}.rs", base.name));
        let source =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // One ground module may use another (`conn` paces with `bucket`): still nothing above.
        let code = shipped(&source).replace(&format!("crate::{}::", base.name), "");
        assert!(
            !code.contains("crate::") && !code.contains("super::"),
            "{} is in the ground layer but imports from the broker above it",
            file.display()
        );
    }
}

/// The checks themselves can fail: an import pointing up is found, one in a comment or a test
/// module is not, and a longer name is not taken for a layer.
#[test]
fn the_import_check_sees_what_it_should() {
    let layers = vec![
        Layer {
            name: "base".into(),
            modules: None,
        },
        Layer {
            name: "engine".into(),
            modules: None,
        },
    ];
    let found = |s: &str| imported_layers(s, &layers);
    assert_eq!(
        found("use crate::engine::cache::Cache;"),
        BTreeSet::from([1])
    );
    assert_eq!(
        found("let x = crate::base::clock::wall_now();"),
        BTreeSet::from([0])
    );
    assert!(found("// see crate::engine").is_empty());
    assert!(found("use crate::engineering;").is_empty());
    assert!(
        found("fn a() {}\n#[cfg(test)]\nmod tests {\n    use crate::engine::x;\n}\n").is_empty()
    );
    // Code after the test module is shipped code again.
    assert_eq!(
        found("#[cfg(test)]\nmod tests {\n    use crate::base::x;\n}\nuse crate::engine::y;\n"),
        BTreeSet::from([1])
    );
    assert_eq!(
        declared_modules("pub mod a;\nmod b;\n#[cfg(test)]\nmod tests;\n"),
        BTreeSet::from(["a".into(), "b".into()])
    );
}
