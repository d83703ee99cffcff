//! Fenced code blocks of the repository's Markdown, with where they are and what kind they are.
//!
//! The docs are tested as code: every fenced block in README.md and docs/**/*.md names its
//! KIND after its language in the info string (```` ```yaml credbroker-config ````), and
//! `tests/tests/docs.rs` checks each block as its kind says. The convention and its kinds are
//! described in README.md, "Docs are tested". `tests/tests/walkthrough.rs` runs the README's
//! `run` blocks from here, so the test runs exactly what a user pastes.

use std::path::{Path, PathBuf};

/// One fenced block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The file, relative to the repository root (e.g. `docs/providers/aws.md`).
    pub file: String,
    /// 1-based line of the opening fence.
    pub line: usize,
    /// First word of the info string (`yaml`, `sh`, `text`, …); empty when there is none.
    pub lang: String,
    /// Second word of the info string (`credbroker-config`, `run`, …), if any.
    pub kind: Option<String>,
    /// The block's lines, without the fences and without the fence's own indentation.
    pub body: String,
}

impl Block {
    /// `file:line`, for messages.
    pub fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root")
}

/// README.md and every `*.md` under docs/, relative to the repository root, sorted.
pub fn doc_files(root: &Path) -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    let mut stack = vec![root.join("docs")];
    let mut found = Vec::new();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(root).expect("under the root");
                found.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    found.sort();
    files.extend(found);
    files
}

/// The fenced blocks of one Markdown text. `file` is only used to label blocks and errors.
///
/// Fences are CommonMark's: a line of three or more backticks (or tildes), indented by at
/// most three spaces more than its list item, closed by a line of at least as many of the
/// same character. An unclosed fence is an error naming its line.
pub fn extract(file: &str, text: &str) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, usize, char, usize, String, Vec<String>)> = None;
    for (i, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let rest = &line[indent..];
        let fence_char = rest.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = fence_char.map_or(0, |c| rest.chars().take_while(|x| *x == c).count());
        match open.as_mut() {
            None => {
                if run >= 3 {
                    let c = fence_char.expect("run > 0");
                    let info = rest[run..].trim().to_owned();
                    open = Some((i + 1, indent, c, run, info, Vec::new()));
                }
            }
            Some((start, fence_indent, c, len, info, body)) => {
                let closes = fence_char == Some(*c) && run >= *len && rest[run..].trim().is_empty();
                if closes {
                    let mut words = info.split_whitespace();
                    blocks.push(Block {
                        file: file.to_owned(),
                        line: *start,
                        lang: words.next().unwrap_or("").to_owned(),
                        kind: words.next().map(str::to_owned),
                        body: body.join("\n") + "\n",
                    });
                    open = None;
                } else {
                    // Drop the fence's indentation (blocks inside list items), never text.
                    let strip = (*fence_indent).min(indent);
                    body.push(line[strip..].to_owned());
                }
            }
        }
    }
    match open {
        Some((start, ..)) => Err(format!(
            "{file}:{start}: fenced block never closed (add the closing ``` line)"
        )),
        None => Ok(blocks),
    }
}

/// The blocks of `file` (relative to `root`); panics with the file's name when it cannot be
/// read or has an unclosed fence.
pub fn blocks_of(root: &Path, file: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(root.join(file))
        .unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    extract(file, &text).unwrap_or_else(|e| panic!("{e}"))
}
