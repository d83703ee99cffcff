//! Docs are tested: every fenced block in README.md and docs/**/*.md carries a kind after its
//! language (```` ```yaml credbroker-config ````), and is checked as its kind says (the table
//! is in README.md, "Docs are tested"):
//!
//! - `yaml credbroker-config`: `credbroker check-config` accepts it;
//! - `yaml credbroker-providers`: `providers:` list items, checked the same way under `providers:`;
//! - `yaml kueue-config`: a Kueue Configuration (or its `multiKueue:` part) follows Kueue's
//!   rules and the shipped config (deploy/kueue/components/kueue-config);
//! - `yaml kustomize-patch`: applied to the Kueue stand-in with the shipped overlay and
//!   rendered with `kubectl kustomize`; the rendered pod must still be one the API server takes;
//! - `yaml kubeconfig` / `yaml k8s`: parsed, with structural checks;
//! - `sh run` / `bash run`: only in README.md; `tests/tests/walkthrough.rs` runs them;
//! - `sh needs-cluster` / `sh needs-cloud` / `sh manual`: `bash -n`, and every `credbroker` /
//!   `credbroker-shim` command line is checked against the CLI's `--help`;
//! - `text`, `console`, or `<language> text`: not run.
//!
//! A block without a kind fails, naming the file and line. The unit tests at the end show each
//! check failing on a broken sample.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use credbroker_tests::doc_blocks::{Block, blocks_of, doc_files, extract, repo_root};
use credbroker_tests::kueue;
use credbroker_tests::{BROKER, COMMAND_TIMEOUT, SHIM, bin, describe, require_tool, run, tempdir};
use serde_json::Value;

/// Where the shipped Kueue configuration lives: the names and paths docs must agree with.
const SHIPPED_KUEUE_CONFIG: &str =
    "deploy/kueue/components/kueue-config/controller_manager_config.yaml";
/// The overlay a `kustomize-patch` block is applied on top of (Kueue's release manifest,
/// deploy/kueue/kueue-install, rendered here from Kueue's own config/default of that version,
/// and the credbroker sidecar the patches edit).
const PATCH_BASE: &str = "deploy/kueue/image-volume";
/// The shim's path in the image layout (`/plugins/bin`, where both shim deliveries put it).
const SHIM_PATH: &str = "/plugins/bin/credbroker-shim";
/// Kueue's `interactiveMode` values (client-go's `ExecInteractiveMode`).
const INTERACTIVE_MODES: [&str; 3] = ["Never", "IfAvailable", "Always"];
/// The exec credential API versions client-go speaks.
const EXEC_API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];
const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";

// ---------------------------------------------------------------------------------------
// The test over the repository's docs
// ---------------------------------------------------------------------------------------

#[test]
fn every_doc_block_has_a_kind_and_passes_its_check() {
    let root = repo_root();
    let mut failures = Vec::new();
    let mut checked = 0;
    for file in doc_files(&root) {
        let text = std::fs::read_to_string(root.join(&file)).expect("readable doc");
        let blocks = match extract(&file, &text) {
            Ok(b) => b,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let context = FileContext::of(&blocks);
        for block in &blocks {
            checked += 1;
            if let Err(e) = check_block(block, &context) {
                failures.push(format!("{}: {e}", block.at()));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} blocks found: is the extraction broken?"
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} doc blocks fail (kinds: README.md, \"Docs are tested\"):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn the_shipped_kueue_config_passes_the_kueue_rules() {
    let text = std::fs::read_to_string(repo_root().join(SHIPPED_KUEUE_CONFIG)).unwrap();
    check_kueue_config(&text).unwrap();
}

/// README and docs/deploy.md state the versions the real-cluster suite runs: e2e/peers.sh's.
#[test]
fn verified_versions_are_the_ones_the_real_cluster_suite_runs() {
    let peers = std::fs::read_to_string(repo_root().join("e2e/peers.sh")).expect("e2e/peers.sh");
    let value = |key: &str| -> String {
        peers
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or_else(|| panic!("e2e/peers.sh sets no {key}"))
            .trim_matches('"')
            .to_owned()
    };
    let mut versions = vec![
        value("KUBE_VERSION"),
        value("ETCD_VERSION"),
        value("CIA_VERSION"),
    ];
    let kueue_versions = peers
        .lines()
        .find_map(|l| l.strip_prefix("KUEUE_VERSIONS=\""))
        .and_then(|v| v.split('"').next())
        .expect("e2e/peers.sh sets KUEUE_VERSIONS");
    versions.extend(kueue_versions.split_whitespace().map(str::to_owned));
    assert_eq!(
        kueue_versions.split_whitespace().collect::<Vec<_>>(),
        kueue::KUEUE_VERSIONS,
        "tests/src/kueue.rs renders over the Kueue versions e2e/ runs"
    );
    for (file, heading) in [
        ("README.md", "**Verified with**"),
        ("docs/deploy.md", "## Verified with"),
        ("docs/deploy.md", "## Requirements"),
    ] {
        let text = std::fs::read_to_string(repo_root().join(file)).expect("read");
        let at = text
            .find(heading)
            .unwrap_or_else(|| panic!("{file} has no {heading:?}"));
        let section: String = text[at..].lines().take(30).collect::<Vec<_>>().join("\n");
        for v in &versions {
            assert!(
                section.contains(v.as_str()),
                "{file}, {heading}: {v} (from e2e/peers.sh) is not stated"
            );
        }
    }
}

#[test]
fn the_readme_walkthrough_is_a_run_block() {
    let blocks = blocks_of(&repo_root(), "README.md");
    let runs: Vec<_> = blocks
        .iter()
        .filter(|b| b.kind.as_deref() == Some("run"))
        .collect();
    assert!(
        runs.iter().any(|b| b.body.contains("credbroker-shim")),
        "README.md has no `sh run` block running the shim: the walk-through test has nothing to run"
    );
}

// ---------------------------------------------------------------------------------------
// Checks by kind
// ---------------------------------------------------------------------------------------

/// What the blocks of one file say that other blocks of the file may refer to.
#[derive(Debug, Default)]
struct FileContext {
    /// Access provider names configured by the file's `kueue-config` blocks.
    access_providers: BTreeSet<String>,
}

impl FileContext {
    fn of(blocks: &[Block]) -> FileContext {
        let mut access_providers = BTreeSet::new();
        for b in blocks
            .iter()
            .filter(|b| b.kind.as_deref() == Some("kueue-config"))
        {
            if let Ok(docs) = parse_yaml_docs(&b.body) {
                for doc in docs {
                    for entry in kueue_entries(&doc).unwrap_or_default() {
                        if let Some(n) = entry.get("name").and_then(Value::as_str) {
                            access_providers.insert(n.to_owned());
                        }
                    }
                }
            }
        }
        FileContext { access_providers }
    }
}

fn check_block(block: &Block, ctx: &FileContext) -> Result<(), String> {
    let lang = block.lang.as_str();
    let kind = block.kind.as_deref();
    match (lang, kind) {
        ("", _) => Err(
            "fenced block without a language and kind: write e.g. ```yaml credbroker-config, \
             ```sh needs-cluster or ```text"
                .into(),
        ),
        ("text" | "console", None) | (_, Some("text")) => Ok(()),
        ("yaml", Some("credbroker-config")) => check_credbroker_config(&block.body),
        ("yaml", Some("credbroker-providers")) => {
            check_credbroker_config(&format!("providers:\n{}", block.body))
        }
        ("yaml", Some("kueue-config")) => check_kueue_config(&block.body),
        ("yaml", Some("kustomize-patch")) => check_kustomize_patch(&block.body),
        ("yaml", Some("kubeconfig")) => check_kubeconfig(&block.body),
        ("yaml", Some("k8s")) => check_k8s(&block.body, ctx),
        ("sh" | "bash", Some("run")) => {
            if block.file != "README.md" {
                return Err(format!(
                    "`{lang} run` blocks are run by tests/tests/walkthrough.rs, which reads only \
                     README.md: tag this one `{lang} needs-cluster`, `{lang} needs-cloud` or \
                     `{lang} manual`, or add a test that runs it"
                ));
            }
            check_shell(lang, &block.body)
        }
        ("sh" | "bash", Some("needs-cluster" | "needs-cloud" | "manual")) => {
            check_shell(lang, &block.body)
        }
        (_, None) => Err(format!(
            "```{lang} block has no kind: add one after the language, e.g. ```{lang} {}",
            suggestion(lang)
        )),
        (_, Some(k)) => Err(format!(
            "unknown kind `{lang} {k}`: the kinds are listed in README.md, \"Docs are tested\""
        )),
    }
}

fn suggestion(lang: &str) -> &'static str {
    match lang {
        "yaml" => {
            "credbroker-config (or credbroker-providers, kueue-config, kustomize-patch, kubeconfig, k8s, text)"
        }
        "sh" | "bash" => "needs-cluster (or needs-cloud, manual, run)",
        _ => "text",
    }
}

/// `credbroker check-config` on `yaml`, written to a temp file.
fn check_credbroker_config(yaml: &str) -> Result<(), String> {
    let dir = tempdir();
    let path = dir.path().join("credbroker.yaml");
    std::fs::write(&path, yaml).expect("write the block to a temp file");
    let out = run(
        Command::new(bin(BROKER)).arg("check-config").arg(&path),
        COMMAND_TIMEOUT,
    );
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`credbroker check-config` refuses it:\n{}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn parse_yaml_docs(text: &str) -> Result<Vec<Value>, String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let doc = docs.last_mut().expect("one doc");
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|d| serde_norway::from_str::<Value>(d).map_err(|e| format!("not YAML: {e}")))
        .collect()
}

/// `(access provider name, --provider argument)` of the shipped Kueue configuration.
fn shipped_access_providers() -> &'static BTreeMap<String, String> {
    static SHIPPED: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    SHIPPED.get_or_init(|| {
        let text = std::fs::read_to_string(repo_root().join(SHIPPED_KUEUE_CONFIG))
            .unwrap_or_else(|e| panic!("{SHIPPED_KUEUE_CONFIG}: {e}"));
        let doc: Value = serde_norway::from_str(&text).expect("shipped Kueue config is YAML");
        kueue_entries(&doc)
            .expect("shipped Kueue config has multiKueue.clusterProfile")
            .iter()
            .map(|e| {
                let name = e["name"].as_str().expect("entry name").to_owned();
                let provider = provider_arg(&e["execConfig"]["args"]).expect("--provider");
                (name, provider)
            })
            .collect()
    })
}

/// The access provider entries of a Kueue Configuration or of its `multiKueue:` part.
fn kueue_entries(doc: &Value) -> Result<Vec<Value>, String> {
    let profile = doc
        .get("multiKueue")
        .and_then(|m| m.get("clusterProfile"))
        .ok_or(
            "no multiKueue.clusterProfile: a kueue-config block shows Kueue's multiKueue settings",
        )?;
    let access = profile.get("accessProviders");
    let legacy = profile.get("credentialsProviders");
    match (access, legacy) {
        (Some(_), Some(_)) => Err(
            "multiKueue.clusterProfile has both accessProviders and credentialsProviders: Kueue \
             refuses the config (field.Forbidden) and the manager crash-loops; keep accessProviders"
                .into(),
        ),
        (None, Some(_)) => Err(
            "multiKueue.clusterProfile.credentialsProviders: the shipped Kueue (v0.19) calls the \
             list accessProviders (credentialsProviders is the v0.15-v0.18 name, said once in prose)"
                .into(),
        ),
        (None, None) => Err("multiKueue.clusterProfile has no accessProviders".into()),
        (Some(list), None) => list
            .as_array()
            .cloned()
            .ok_or_else(|| "multiKueue.clusterProfile.accessProviders is not a list".into()),
    }
}

/// The value after `--provider` in an args list.
fn provider_arg(args: &Value) -> Option<String> {
    let args: Vec<&str> = args.as_array()?.iter().filter_map(Value::as_str).collect();
    let i = args.iter().position(|a| *a == "--provider")?;
    args.get(i + 1).map(|s| (*s).to_owned())
}

/// Kueue's validation of the access provider list, and agreement with the shipped config.
fn check_kueue_config(text: &str) -> Result<(), String> {
    let docs = parse_yaml_docs(text)?;
    if docs.len() != 1 {
        return Err(format!(
            "{} YAML documents: a kueue-config block holds one Kueue Configuration (put other \
             objects in their own ```yaml k8s block)",
            docs.len()
        ));
    }
    let doc = &docs[0];
    let is_kueue = doc["apiVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with("config.kueue.x-k8s.io/"));
    if doc.get("kind").is_some() && (doc["kind"] != "Configuration" || !is_kueue) {
        return Err(
            "a whole Kueue config is apiVersion config.kueue.x-k8s.io/…, kind Configuration".into(),
        );
    }
    let entries = kueue_entries(doc)?;
    let shipped = shipped_access_providers();
    let mut errors = Vec::new();
    let mut names = BTreeSet::new();
    for (i, e) in entries.iter().enumerate() {
        let at = format!("accessProviders[{i}]");
        let Some(name) = e.get("name").and_then(Value::as_str) else {
            errors.push(format!("{at}: no name"));
            continue;
        };
        if !names.insert(name) {
            errors.push(format!("{at}: name {name:?} appears twice"));
        }
        let exec = &e["execConfig"];
        if !exec["apiVersion"]
            .as_str()
            .is_some_and(|v| EXEC_API_VERSIONS.contains(&v))
        {
            errors.push(format!(
                "{at} ({name}): execConfig.apiVersion must be one of {EXEC_API_VERSIONS:?}"
            ));
        }
        if exec["command"].as_str() != Some(SHIM_PATH) {
            errors.push(format!(
                "{at} ({name}): execConfig.command is {}, the shim is at {SHIM_PATH} in the image layout",
                exec["command"]
            ));
        }
        if exec["provideClusterInfo"] != Value::Bool(true) {
            errors.push(format!(
                "{at} ({name}): execConfig.provideClusterInfo must be true (without it the shim gets no per-cluster input)"
            ));
        }
        if !exec["interactiveMode"]
            .as_str()
            .is_some_and(|m| INTERACTIVE_MODES.contains(&m))
        {
            errors.push(format!(
                "{at} ({name}): execConfig.interactiveMode must be set (Kueue requires it; the shim never prompts: Never)"
            ));
        }
        let provider = provider_arg(&exec["args"]);
        let Some(provider) = provider else {
            errors.push(format!(
                "{at} ({name}): execConfig.args has no `--provider NAME`"
            ));
            continue;
        };
        if let Some(want) = shipped.get(name)
            && *want != provider
        {
            errors.push(format!(
                "{at}: access provider {name:?} runs --provider {provider}, the shipped config \
                 ({SHIPPED_KUEUE_CONFIG}) runs --provider {want}"
            ));
        }
        if let Some((shipped_name, _)) = shipped.iter().find(|(_, p)| **p == provider)
            && shipped_name != name
        {
            errors.push(format!(
                "{at}: --provider {provider} is access provider {shipped_name:?} in the shipped \
                 config ({SHIPPED_KUEUE_CONFIG}), not {name:?}: one name per cloud"
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Applies `patch` on top of [`PATCH_BASE`] and renders it with `kubectl kustomize`.
fn check_kustomize_patch(patch: &str) -> Result<(), String> {
    let kubectl = require_tool(
        "kubectl",
        "install kubectl (`kubectl kustomize` renders patches)",
    );
    let dir = tempdir();
    std::fs::write(dir.path().join("patch.yaml"), patch).expect("write the patch");
    let base = deploy_tree().join(PATCH_BASE);
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [{}]\npatches: [{{path: patch.yaml}}]\n",
            serde_json::to_string(&relative_to(dir.path(), &base))
                .expect("write the kustomization")
        ),
    )
    .expect("JSON string");
    let render = |d: &Path| {
        run(
            Command::new(&kubectl)
                .args(["kustomize", "--load-restrictor", "LoadRestrictionsNone"])
                .arg(d),
            COMMAND_TIMEOUT,
        )
    };
    let out = render(dir.path());
    if !out.status.success() {
        return Err(format!(
            "`kubectl kustomize` cannot apply it to {PATCH_BASE}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let patched = String::from_utf8_lossy(&out.stdout).into_owned();
    let plain = render(&base);
    assert!(plain.status.success(), "{PATCH_BASE}: {}", describe(&plain));
    if patched == String::from_utf8_lossy(&plain.stdout) {
        return Err(format!("applied to {PATCH_BASE}, it changes nothing"));
    }
    for doc in parse_yaml_docs(&patched)? {
        if doc["kind"] == "Deployment" {
            check_pod_spec(&doc["spec"]["template"]["spec"])?;
        }
    }
    Ok(())
}

/// The copy of `deploy/` over Kueue's real manifests at the shipped version, once per process.
fn deploy_tree() -> &'static Path {
    static TREE: OnceLock<std::path::PathBuf> = OnceLock::new();
    TREE.get_or_init(|| {
        let at = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docs-deploy-over-kueue");
        kueue::deploy_over_kueue(&repo_root(), &at, kueue::SHIPPED_KUEUE_VERSION)
    })
}

/// `to` as a path relative to `from` (kustomize refuses absolute resource paths).
fn relative_to(from: &Path, to: &Path) -> String {
    // `..` is resolved on the real path, so count the real path's components.
    let from = from.canonicalize().expect("temp dir exists");
    let up = "../".repeat(from.components().count() - 1);
    format!(
        "{up}{}",
        to.to_str().expect("UTF-8 path").trim_start_matches('/')
    )
}

/// What the API server checks first on a pod: every container has an image, names are
/// unique across containers and init containers, mounts name existing volumes.
fn check_pod_spec(spec: &Value) -> Result<(), String> {
    let volumes: BTreeSet<&str> = spec["volumes"]
        .as_array()
        .map(|v| v.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default();
    let mut names = BTreeSet::new();
    let mut errors = Vec::new();
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            let name = c["name"].as_str().unwrap_or("?");
            if !names.insert(name.to_owned()) {
                errors.push(format!(
                    "rendered pod has two containers named {name:?} (the patch added {list}[{name}]; \
                     patch the container where it lives)"
                ));
            }
            if c["image"].as_str().is_none_or(str::is_empty) {
                errors.push(format!("rendered {list}[{name}] has no image"));
            }
            let mounts: Vec<&Value> = c["volumeMounts"].as_array().into_iter().flatten().collect();
            for m in &mounts {
                let v = m["name"].as_str().unwrap_or("?");
                if !volumes.contains(v) {
                    errors.push(format!(
                        "rendered {list}[{name}] mounts volume {v:?}, which the pod does not have"
                    ));
                }
            }
            errors.extend(nested_in_read_only(spec, list, name, &mounts));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Mounts inside another mount of the same container whose volume is read-only (a ConfigMap,
/// Secret, projected or image volume, or `readOnly: true`): the runtime must create the inner
/// mount point inside a read-only filesystem, which fails at container start.
fn nested_in_read_only(
    spec: &Value,
    list: &str,
    container: &str,
    mounts: &[&Value],
) -> Vec<String> {
    let read_only = |m: &Value| {
        let volume = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == m["name"]);
        m["readOnly"] == true
            || volume.is_some_and(|v| {
                ["configMap", "secret", "projected", "image", "downwardAPI"]
                    .iter()
                    .any(|kind| !v[*kind].is_null())
            })
    };
    let mut errors = Vec::new();
    for outer in mounts.iter().filter(|m| read_only(m)) {
        let Some(at) = outer["mountPath"].as_str() else {
            continue;
        };
        for inner in mounts {
            let Some(path) = inner["mountPath"].as_str() else {
                continue;
            };
            if path.starts_with(&format!("{}/", at.trim_end_matches('/'))) {
                errors.push(format!(
                    "rendered {list}[{container}] mounts {} at {path}, inside its read-only mount \
                     of {} at {at}: the mount point cannot be created there; mount it elsewhere",
                    inner["name"], outer["name"]
                ));
            }
        }
    }
    errors
}

/// An exec user as credbroker's docs write them: the shim, with cluster info, never interactive.
fn check_exec(exec: &Value, at: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if !exec["apiVersion"]
        .as_str()
        .is_some_and(|v| EXEC_API_VERSIONS.contains(&v))
    {
        errors.push(format!(
            "{at}.apiVersion must be one of {EXEC_API_VERSIONS:?}"
        ));
    }
    if !exec["command"]
        .as_str()
        .is_some_and(|c| c.ends_with("credbroker-shim"))
    {
        errors.push(format!("{at}.command must run credbroker-shim"));
    }
    if provider_arg(&exec["args"]).is_none() {
        errors.push(format!("{at}.args has no `--provider NAME`"));
    }
    if exec["provideClusterInfo"] != Value::Bool(true) {
        errors.push(format!("{at}.provideClusterInfo must be true"));
    }
    if !exec["interactiveMode"]
        .as_str()
        .is_some_and(|m| INTERACTIVE_MODES.contains(&m))
    {
        errors.push(format!("{at}.interactiveMode must be set (Never)"));
    }
    errors
}

/// Cluster extensions: a list of `{name, extension}`, the exec one a mapping.
fn check_extensions(exts: &Value, at: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(list) = exts.as_array() else {
        if !exts.is_null() {
            errors.push(format!(
                "{at}.extensions must be a list of {{name, extension}}"
            ));
        }
        return errors;
    };
    for (i, e) in list.iter().enumerate() {
        if e["name"] == EXEC_EXTENSION && !e["extension"].is_object() {
            errors.push(format!(
                "{at}.extensions[{i}].extension must be a mapping (spec.cluster.config)"
            ));
        }
    }
    errors
}

fn check_kubeconfig(text: &str) -> Result<(), String> {
    let docs = parse_yaml_docs(text)?;
    let [doc] = docs.as_slice() else {
        return Err("a kubeconfig block holds one document".into());
    };
    let mut errors = Vec::new();
    let users = doc["users"].as_array();
    let clusters = doc["clusters"].as_array();
    if users.is_none() && clusters.is_none() {
        errors.push("a kubeconfig has `users:` and/or `clusters:` lists".to_owned());
    }
    for (i, u) in users.into_iter().flatten().enumerate() {
        if u["name"].as_str().is_none() {
            errors.push(format!("users[{i}] has no name"));
        }
        if !u["user"]["exec"].is_null() {
            errors.extend(check_exec(
                &u["user"]["exec"],
                &format!("users[{i}].user.exec"),
            ));
        }
    }
    for (i, c) in clusters.into_iter().flatten().enumerate() {
        let at = format!("clusters[{i}].cluster");
        let server = c["cluster"]["server"].as_str().unwrap_or("");
        if !server.starts_with("https://") {
            errors.push(format!(
                "{at}.server must be https:// (client-go runs exec plugins only for https servers)"
            ));
        }
        errors.extend(check_extensions(&c["cluster"]["extensions"], &at));
    }
    if errors.is_empty() && !doc["apiVersion"].is_null() {
        // A whole kubeconfig must load as pasted (a `…` in certificate-authority-data is
        // "illegal base64 data" to client-go).
        let kubectl = require_tool("kubectl", "install kubectl (it loads kubeconfig blocks)");
        let dir = tempdir();
        let file = dir.path().join("kubeconfig");
        std::fs::write(&file, text).expect("write the kubeconfig");
        let out = run(
            Command::new(kubectl)
                .env_remove("KUBECONFIG")
                .args(["config", "view", "--kubeconfig"])
                .arg(&file),
            COMMAND_TIMEOUT,
        );
        if !out.status.success() {
            errors.push(format!(
                "`kubectl config view` cannot load it: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn check_k8s(text: &str, ctx: &FileContext) -> Result<(), String> {
    let docs = parse_yaml_docs(text)?;
    if docs.is_empty() {
        return Err("no Kubernetes object in the block".into());
    }
    let mut errors = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let at = format!("object {}", i + 1);
        if !doc["apiVersion"].is_string() || !doc["kind"].is_string() {
            errors.push(format!("{at}: whole objects only (apiVersion and kind); a fragment of a patch is a ```yaml kustomize-patch"));
            continue;
        }
        if doc["metadata"]["name"].as_str().is_none_or(str::is_empty) {
            errors.push(format!("{at} ({}): no metadata.name", doc["kind"]));
        }
        if doc["kind"] == "ClusterProfile" {
            for (j, p) in doc["status"]["accessProviders"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let pat = format!("{at} (ClusterProfile).status.accessProviders[{j}]");
                let name = p["name"].as_str().unwrap_or("");
                if !shipped_access_providers().contains_key(name)
                    && !ctx.access_providers.contains(name)
                {
                    errors.push(format!(
                        "{pat}: access provider {name:?} is neither in the shipped Kueue config \
                         ({SHIPPED_KUEUE_CONFIG}: {:?}) nor in a kueue-config block of this file",
                        shipped_access_providers().keys().collect::<Vec<_>>()
                    ));
                }
                if !p["cluster"]["server"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("https://"))
                {
                    errors.push(format!("{pat}.cluster.server must be https://"));
                }
                errors.extend(check_extensions(
                    &p["cluster"]["extensions"],
                    &format!("{pat}.cluster"),
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// `bash -n`, then each `credbroker` / `credbroker-shim` command line against the CLI.
fn check_shell(lang: &str, body: &str) -> Result<(), String> {
    let bash = require_tool("bash", "bash checks the docs' shell blocks (`bash -n`)");
    let dir = tempdir();
    let script = dir.path().join(format!("block.{lang}"));
    std::fs::write(&script, body).expect("write the block to a temp file");
    let out = run(Command::new(bash).arg("-n").arg(&script), COMMAND_TIMEOUT);
    if !out.status.success() {
        return Err(format!(
            "`bash -n` refuses it: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let errors: Vec<String> = logical_lines(body)
        .iter()
        .filter_map(|l| check_cli_line(l).err())
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Lines with `\`-continuations joined and comments dropped.
fn logical_lines(body: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for line in body.lines() {
        if let Some(head) = line.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(line);
            lines.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
        .into_iter()
        .map(|l| match l.find(" #") {
            Some(i) => l[..i].to_owned(),
            None if l.trim_start().starts_with('#') => String::new(),
            None => l,
        })
        .collect()
}

/// `credbroker …` or `credbroker-shim …` in a command line: subcommand and flags exist.
fn check_cli_line(line: &str) -> Result<(), String> {
    // Split into simple commands at shell operators.
    let mut line = line.to_owned();
    for op in ["&&", "||", "|", ";", "$(", ")", "&"] {
        line = line.replace(op, "\n");
    }
    for cmd in line.lines() {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        if let Some((binary, args)) = cli_invocation(&words) {
            check_cli_args(binary, args).map_err(|e| format!("`{}`: {e}", cmd.trim()))?;
        }
    }
    Ok(())
}

/// The credbroker binary this simple command runs, and its arguments: the first word (after
/// `VAR=value` assignments and `exec`/`sudo`) naming `credbroker` or `credbroker-shim` by
/// any path, or `cargo run … -p <binary> -- ARGS`.
fn cli_invocation<'a>(words: &'a [&'a str]) -> Option<(&'a str, &'a [&'a str])> {
    let mut i = 0;
    while i < words.len()
        && (words[i].contains('=') && !words[i].starts_with('-')
            || ["exec", "sudo", "time"].contains(&words[i]))
    {
        i += 1;
    }
    let first = *words.get(i)?;
    let base = first.rsplit('/').next().unwrap_or("");
    if base == BROKER || base == SHIM {
        return Some((base, &words[i + 1..]));
    }
    if first == "cargo" && words.get(i + 1) == Some(&"run") {
        let dashdash = words.iter().position(|w| *w == "--")?;
        let p = words[..dashdash]
            .iter()
            .position(|w| *w == "-p" || *w == "--package")?;
        let pkg = *words.get(p + 1)?;
        if pkg == BROKER || pkg == SHIM {
            return Some((pkg, &words[dashdash + 1..]));
        }
    }
    None
}

fn cli_help(args: &[&str]) -> String {
    static CACHE: OnceLock<std::sync::Mutex<BTreeMap<String, String>>> = OnceLock::new();
    let key = args.join(" ");
    let cache = CACHE.get_or_init(Default::default);
    if let Some(h) = cache.lock().expect("cache lock").get(&key) {
        return h.clone();
    }
    let out = run(Command::new(bin(args[0])).args(&args[1..]), COMMAND_TIMEOUT);
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    cache.lock().expect("cache lock").insert(key, help.clone());
    help
}

fn check_cli_args(binary: &str, args: &[&str]) -> Result<(), String> {
    let help = if binary == SHIM {
        // The shim's one subcommand, `install DIR`, is its first argument; any other first
        // word that is not a flag is a typo client-go would fail on.
        if let Some(first) = args.first().filter(|a| !a.starts_with('-'))
            && *first != "install"
        {
            return Err(format!(
                "credbroker-shim has no subcommand {first:?} (install, or flags only)"
            ));
        }
        cli_help(&[SHIM, "--help"])
    } else {
        let Some(sub) = args.first() else {
            return Err(
                "credbroker needs a subcommand (serve, health, check-config, version)".into(),
            );
        };
        if ![
            "serve",
            "health",
            "check-config",
            "version",
            "help",
            "--help",
            "--version",
            "-h",
            "-V",
        ]
        .contains(sub)
        {
            return Err(format!(
                "credbroker has no subcommand {sub:?} (serve, health, check-config, version)"
            ));
        }
        if sub.starts_with('-') {
            return Ok(());
        }
        cli_help(&[BROKER, sub, "--help"])
    };
    for a in args {
        if let Some(flag) = a.strip_prefix("--") {
            let flag = flag.split('=').next().unwrap_or("");
            if flag.is_empty() {
                continue;
            }
            if !help.contains(&format!("--{flag} ")) && !help.contains(&format!("--{flag}\n")) {
                return Err(format!(
                    "{binary} has no flag --{flag} (see `{binary} --help`)"
                ));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Each check fails on a broken sample
// ---------------------------------------------------------------------------------------

fn sample(md: &str) -> Vec<Result<(), String>> {
    let blocks = extract("sample.md", md).expect("sample Markdown has closed fences");
    let ctx = FileContext::of(&blocks);
    blocks.iter().map(|b| check_block(b, &ctx)).collect()
}

fn assert_fails(md: &str, needle: &str) {
    let results = sample(md);
    let err = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .unwrap_or_else(|| panic!("expected a failure containing {needle:?}, all passed:\n{md}"));
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
}

fn assert_passes(md: &str) {
    for r in sample(md) {
        r.expect("sample block passes");
    }
}

const GOOD_ENTRY: &str = "      - name: eks
        execConfig:
          apiVersion: client.authentication.k8s.io/v1
          command: /plugins/bin/credbroker-shim
          args: [--provider, eks]
          provideClusterInfo: true
          interactiveMode: Never
";

#[test]
fn a_block_without_a_kind_fails_naming_the_line() {
    let md = "# t\n\ntext\n\n```yaml\na: 1\n```\n";
    let blocks = extract("sample.md", md).unwrap();
    assert_eq!(blocks[0].at(), "sample.md:5");
    assert_fails(md, "has no kind");
    assert_fails("```\nplain\n```\n", "without a language and kind");
    assert_fails("```yaml bogus\na: 1\n```\n", "unknown kind `yaml bogus`");
    assert!(
        extract("sample.md", "```sh run\necho\n")
            .unwrap_err()
            .contains("sample.md:1")
    );
}

#[test]
fn indented_blocks_in_list_items_are_found() {
    let blocks = extract("s.md", "- item\n\n  ```yaml k8s\n  a: 1\n  ```\n").unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].body, "a: 1\n");
    assert_eq!(blocks[0].kind.as_deref(), Some("k8s"));
}

#[test]
fn a_credbroker_config_with_an_unknown_key_fails() {
    assert_passes(
        "```yaml credbroker-config\nproviders:\n  - {name: s, type: file, file: {path: \"/t/{clusterName}\"}}\n```\n",
    );
    assert_fails(
        "```yaml credbroker-config\nproviders:\n  - {name: s, type: file, file: {path: /t, bogusKey: 1}}\n```\n",
        "bogusKey",
    );
    assert_fails(
        "```yaml credbroker-providers\n- {name: s, type: nope}\n```\n",
        "check-config` refuses it",
    );
}

#[test]
fn a_kueue_config_breaking_kueue_rules_fails() {
    let good = format!(
        "```yaml kueue-config\nmultiKueue:\n  clusterProfile:\n    accessProviders:\n{GOOD_ENTRY}```\n"
    );
    assert_passes(&good);
    let both = format!(
        "```yaml kueue-config\nmultiKueue:\n  clusterProfile:\n    credentialsProviders: []\n    accessProviders:\n{GOOD_ENTRY}```\n"
    );
    assert_fails(&both, "both accessProviders and credentialsProviders");
    assert_fails(
        &good.replace("/plugins/bin/", "/credbroker/"),
        "the shim is at /plugins/bin/credbroker-shim",
    );
    assert_fails(
        &good.replace("          interactiveMode: Never\n", ""),
        "interactiveMode must be set",
    );
    assert_fails(
        &good.replace("provideClusterInfo: true", "provideClusterInfo: false"),
        "provideClusterInfo must be true",
    );
    assert_fails(
        &good.replace("name: eks", "name: credbroker-eks"),
        "one name per cloud",
    );
    assert_fails(
        &good.replace("accessProviders", "credentialsProviders"),
        "calls the list accessProviders",
    );
}

#[test]
fn a_kustomize_patch_adding_a_second_credbroker_container_fails() {
    let patch = "```yaml kustomize-patch
apiVersion: apps/v1
kind: Deployment
metadata: {name: kueue-controller-manager, namespace: kueue-system}
spec:
  template:
    spec:
      volumes:
        - {name: extra, emptyDir: {}}
      CONTAINERS:
        - name: credbroker
          volumeMounts:
            - {name: extra, mountPath: /extra}
```
";
    assert_passes(&patch.replace("CONTAINERS", "initContainers"));
    assert_fails(
        &patch.replace("CONTAINERS", "containers"),
        "two containers named \"credbroker\"",
    );
    assert_fails(
        "```yaml kustomize-patch\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: nope, namespace: kueue-system}\nspec: {replicas: 2}\n```\n",
        "cannot apply it",
    );
    // Issue 23.5: cross-cloud.md mounted GCP credentials inside the config's ConfigMap mount.
    assert_fails(
        &patch
            .replace("CONTAINERS", "initContainers")
            .replace("/extra", "/etc/credbroker/gcp"),
        "inside its read-only mount of \"credbroker-config\" at /etc/credbroker",
    );
}

#[test]
fn shell_blocks_are_syntax_and_cli_checked() {
    assert_passes(
        "```sh needs-cluster\nkubectl get pods\ncredbroker health --socket /x --timeout 2s\n```\n",
    );
    assert_fails("```sh needs-cluster\nif then\n```\n", "bash -n");
    assert_fails(
        "```sh needs-cloud\n/bin/credbroker healthz\n```\n",
        "no subcommand \"healthz\"",
    );
    assert_fails(
        "```sh manual\ncredbroker-shim --provider x --sock /s\n```\n",
        "no flag --sock",
    );
    assert_passes("```sh manual\ncredbroker-shim install /d --name n\n```\n");
    assert_fails(
        "```sh manual\ncredbroker-shim instal /d\n```\n",
        "no subcommand \"instal\"",
    );
    assert_fails(
        "```sh manual\ncredbroker-shim install /d --nmae n\n```\n",
        "no flag --nmae",
    );
    assert_fails(
        "```sh manual\ncargo run -p credbroker -- serve --bogus\n```\n",
        "no flag --bogus",
    );
    assert_fails("```sh run\necho hi\n```\n", "only README.md");
}

#[test]
fn kubeconfig_and_k8s_blocks_are_checked() {
    let kubeconfig = "```yaml kubeconfig
users:
  - name: dev
    user:
      exec:
        apiVersion: client.authentication.k8s.io/v1
        command: /x/credbroker-shim
        args: [--provider, static]
        provideClusterInfo: true
        interactiveMode: Never
clusters:
  - name: dev
    cluster: {server: https://dev.example.com}
```
";
    assert_passes(kubeconfig);
    assert_fails(
        &kubeconfig.replace("        interactiveMode: Never\n", ""),
        "interactiveMode",
    );
    assert_fails(&kubeconfig.replace("https://dev", "http://dev"), "https");
    // A whole kubeconfig must load: README's placeholder CA data once failed as pasted.
    let whole = kubeconfig.replace(
        "```yaml kubeconfig\n",
        "```yaml kubeconfig\napiVersion: v1\nkind: Config\n",
    );
    assert_passes(&whole);
    assert_fails(
        &whole.replace(
            "{server: https://dev.example.com}",
            "{server: https://dev.example.com, certificate-authority-data: …}",
        ),
        "illegal base64",
    );
    let profile = "```yaml k8s
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ClusterProfile
metadata: {name: c, namespace: kueue-system}
status:
  accessProviders:
    - name: google
      cluster: {server: https://1.2.3.4}
```
";
    assert_passes(profile);
    assert_fails(
        &profile.replace("name: google", "name: credbroker-gke"),
        "credbroker-gke",
    );
    assert_fails("```yaml k8s\nstatus: {}\n```\n", "whole objects only");
}

// ---------------------------------------------------------------------------------------
// References between files, the debug recipe, the kubectl the docs need
// ---------------------------------------------------------------------------------------

/// The headings of a Markdown text (outside fenced blocks), without their `#`s.
fn headings(text: &str) -> Vec<String> {
    let mut fence: Option<char> = None;
    let mut found = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let c = t.chars().next();
        if t.starts_with("```") || t.starts_with("~~~") {
            match fence {
                None => fence = c,
                Some(f) if Some(f) == c => fence = None,
                Some(_) => {}
            }
            continue;
        }
        if fence.is_none() && line.starts_with('#') {
            found.push(line.trim_start_matches('#').trim().to_owned());
        }
    }
    found
}

/// A text with each line's indentation and comment marks (`#`, `//`) dropped and the lines
/// joined by spaces, so a reference wrapped over two comment lines reads as one.
fn joined(text: &str) -> String {
    text.lines()
        .map(|l| {
            l.trim_start()
                .trim_start_matches('#')
                .trim_start_matches("//")
                .trim()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `FILE, "HEADING"` references in `text` (FILE: a `.md` path or `README`), as (file relative
/// to the repository root, heading).
fn heading_references(text: &str) -> Vec<(String, String)> {
    let text = joined(text);
    let mut refs = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find(", \"") {
        let before = &rest[..at];
        let token = before
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
            .next()
            .unwrap_or("");
        let after = &rest[at + 3..];
        let Some(end) = after.find('"') else { break };
        let heading = after[..end].to_owned();
        let file = if token == "README" || token == "README.md" {
            Some("README.md".to_owned())
        } else if token.ends_with(".md") {
            // A bare name is a page of docs/ (deploy.md) or of the root (BENCHMARKS.md).
            let docs = format!("docs/{token}");
            Some(
                if !token.contains('/') && repo_root().join(&docs).is_file() {
                    docs
                } else {
                    token.to_owned()
                },
            )
        } else {
            None
        };
        if let Some(file) = file {
            refs.push((file, heading));
        }
        rest = &after[end..];
    }
    refs
}

/// `section N` (and `sections N and M`) in `text`: the numbers.
fn section_references(text: &str) -> Vec<u32> {
    let text = joined(text);
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut found = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if *w == "section" || *w == "sections" {
            for next in words[i + 1..].iter().take(3) {
                let n = next.trim_end_matches(|c: char| !c.is_ascii_digit());
                match n.parse::<u32>() {
                    Ok(n) => found.push(n),
                    Err(_) if *next == "and" => continue,
                    Err(_) => break,
                }
            }
        }
    }
    found
}

/// Every file under deploy/ (relative to the root), for the references its comments make.
fn deploy_files(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.join("deploy")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read deploy/").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.push(
                    path.strip_prefix(root)
                        .expect("under the root")
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    found.sort();
    found
}

/// Defect: comments in deploy/ pointed at sections docs/deploy.md does not have ("Point the
/// overlay at your Kueue", "Your broker config"). Every `FILE, "HEADING"` reference in deploy/
/// and the docs to README or a page of docs/ names a heading of FILE, and every `section N` in deploy/ and docs/deploy.md a
/// numbered section of docs/deploy.md.
#[test]
fn references_name_headings_and_sections_that_exist() {
    let root = repo_root();
    let deploy_md = std::fs::read_to_string(root.join("docs/deploy.md")).expect("deploy.md");
    let numbered: BTreeSet<u32> = headings(&deploy_md)
        .iter()
        .filter_map(|h| h.split_once(". ").and_then(|(n, _)| n.parse().ok()))
        .collect();
    assert!(
        numbered.contains(&10),
        "deploy.md's numbered sections: {numbered:?}"
    );
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut files = deploy_files(&root);
    files.extend(doc_files(&root));
    for file in &files {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue; // not text
        };
        for (target, heading) in heading_references(&text) {
            // README and docs/ pages; BENCHMARKS.md names its sections otherwise.
            if !(target == "README.md" || target.starts_with("docs/")) {
                continue;
            }
            checked += 1;
            let Ok(target_text) = std::fs::read_to_string(root.join(&target)) else {
                failures.push(format!("{file}: {target}, {heading:?}: no file {target}"));
                continue;
            };
            let found = headings(&target_text).iter().any(|h| {
                *h == heading
                    || h.split_once(". ")
                        .is_some_and(|(_, title)| title == heading)
            });
            if !found {
                failures.push(format!(
                    "{file}: {target}, {heading:?}: {target} has no such heading"
                ));
            }
        }
        if file.starts_with("deploy/") || file == "docs/deploy.md" {
            for n in section_references(&text) {
                checked += 1;
                if !numbered.contains(&n) {
                    failures.push(format!(
                        "{file}: section {n}: docs/deploy.md has no section {n}"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} references found: is the scan broken?"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn reference_scanners_read_wrapped_comments() {
    let text = "# see docs/deploy.md, \"The broker's identity on each\n#   worker\" and README, \"The shim\";\n# (docs/deploy.md,\n# section 3), sections 3 and 5";
    assert_eq!(
        heading_references(text),
        [
            (
                "docs/deploy.md".to_owned(),
                "The broker's identity on each worker".to_owned()
            ),
            ("README.md".to_owned(), "The shim".to_owned())
        ]
    );
    assert_eq!(section_references(text), [3, 3, 5]);
    assert_eq!(
        headings("# A\n```sh x\n# not a heading\n```\n## 3. B\n"),
        ["A", "3. B"]
    );
}

/// The socket path the broker config credbroker ships puts the socket at.
fn shipped_socket_path() -> String {
    let file = "deploy/kueue/components/credbroker-sidecar/credbroker.yaml";
    let text = std::fs::read_to_string(repo_root().join(file)).expect("the sidecar's config");
    let config: Value = serde_norway::from_str(&text).expect("YAML");
    config["socket"]["path"]
        .as_str()
        .expect("socket.path")
        .to_owned()
}

/// Defect: docs/operations.md ran its grpcurl recipes "from a debug container that mounts the
/// socket volume", which `kubectl debug` cannot make (an ephemeral container gets no volume
/// mounts). Every in-cluster grpcurl recipe reaches the socket as docs/deploy.md, section 8,
/// does: through the broker's root, `/proc/1/root`, from a container targeting the sidecar.
#[test]
fn in_cluster_grpcurl_recipes_reach_the_socket_through_the_sidecars_root() {
    let root = repo_root();
    let want = format!("/proc/1/root{}", shipped_socket_path());
    let mut recipes = 0;
    for file in ["docs/deploy.md", "docs/operations.md"] {
        for block in blocks_of(&root, file) {
            if block.kind.as_deref() != Some("needs-cluster") || !block.body.contains("grpcurl") {
                continue;
            }
            recipes += 1;
            let socks: Vec<&str> = block
                .body
                .lines()
                .filter_map(|l| l.trim().strip_prefix("sock="))
                .collect();
            assert!(
                !socks.is_empty(),
                "{}: names the socket with sock=…",
                block.at()
            );
            for sock in socks {
                let path = sock
                    .trim_start_matches("${sock:-")
                    .trim_end_matches('}')
                    .trim_matches('"');
                assert_eq!(
                    path,
                    want,
                    "{}: a `kubectl debug` container sees the socket only through the sidecar's \
                     root (docs/deploy.md, section 8)",
                    block.at()
                );
            }
        }
        let text = std::fs::read_to_string(root.join(file)).expect("read");
        assert!(
            !text.contains("mounts the socket volume"),
            "{file}: `kubectl debug` cannot mount the socket volume"
        );
    }
    assert!(
        recipes >= 3,
        "only {recipes} in-cluster grpcurl recipes found"
    );
    let ops = std::fs::read_to_string(root.join("docs/operations.md")).expect("operations.md");
    assert!(
        ops.contains("deploy.md#8-verify-with-grpcurl-from-a-debug-container"),
        "docs/operations.md points at the debug container of docs/deploy.md, section 8"
    );
}

/// The kubectl flags the docs use that need a newer kubectl than the rest: (subcommand, flag,
/// the first minor release with it on by default). `kubectl debug --custom` with a YAML file:
/// KEP-4292, alpha behind KUBECTL_DEBUG_CUSTOM_PROFILE in 1.30, beta and on by default with
/// YAML in 1.31. `kubectl apply --subresource`: 1.27.
const KUBECTL_FLAG_VERSIONS: [(&str, &str, u32); 2] =
    [("debug", "--custom", 31), ("apply", "--subresource", 27)];

/// Defect: section 8 runs `kubectl debug --custom`, which needs kubectl 1.31, while
/// Requirements said 1.27. The kubectl Requirements name is at least what every kubectl flag
/// the docs use needs, and the kubectl here knows those flags.
#[test]
fn requirements_name_a_kubectl_that_runs_every_recipe() {
    let root = repo_root();
    let deploy = std::fs::read_to_string(root.join("docs/deploy.md")).expect("deploy.md");
    let req = &deploy[deploy.find("## Requirements").expect("Requirements")..];
    let req = &req[..req[3..].find("\n## ").map_or(req.len(), |i| i + 3)];
    let minor: u32 = req
        .split("kubectl ≥ 1.")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("Requirements say `kubectl ≥ 1.N`");
    let mut used = 0;
    for file in doc_files(&root) {
        for block in blocks_of(&root, &file) {
            if block.lang != "sh" && block.lang != "bash" {
                continue;
            }
            for line in logical_lines(&block.body) {
                for (sub, flag, needs) in KUBECTL_FLAG_VERSIONS {
                    let words: Vec<&str> = line.split_whitespace().collect();
                    let runs = words
                        .iter()
                        .position(|w| *w == "kubectl")
                        .is_some_and(|k| words[k + 1..].contains(&sub));
                    if runs && words.iter().any(|w| w.starts_with(flag)) {
                        used += 1;
                        assert!(
                            minor >= needs,
                            "{}: `kubectl {sub} {flag}` needs kubectl ≥ 1.{needs}; docs/deploy.md, \
                             Requirements, says 1.{minor}",
                            block.at()
                        );
                    }
                }
            }
        }
    }
    assert!(
        used >= 2,
        "the docs use the flags this test knows ({used} uses)"
    );
    let kubectl = require_tool("kubectl", "install kubectl");
    for (sub, flag, _) in KUBECTL_FLAG_VERSIONS {
        let out = run(
            Command::new(&kubectl).args([sub, "--help"]),
            COMMAND_TIMEOUT,
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("{flag}=")),
            "kubectl {sub} here has no {flag}: {}",
            describe(&out)
        );
    }
}
