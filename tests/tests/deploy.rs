//! `deploy/` and `scripts/image-content.sh`: what a platform team applies to put credbroker
//! into Kueue's manager pod.
//!
//! - every kustomization under `deploy/` renders with `kubectl kustomize`;
//! - the rendered objects hold together: a hardened native sidecar sharing the socket volume
//!   with the manager, a broker config that passes `credbroker check-config`, a Kueue config
//!   whose exec entries run the shim with `provideClusterInfo: true`, example ClusterProfiles
//!   carrying what their provider needs, identity overlays wiring the manager's ServiceAccount;
//! - the image-content script lays out static binaries where the manifests expect them, and
//!   in an empty root the rendered broker config serves the rendered probe and an example
//!   cluster's token to the rendered Kueue exec entry.
//!
//! The script is run once per test process with `--profile debug` (a release build takes
//! minutes); its output lands in `CARGO_TARGET_TMPDIR/deploy-image-content`.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use credbroker_tests::doc_blocks::blocks_of;
use credbroker_tests::kueue::{self, KUEUE_VERSIONS, SHIPPED_KUEUE_VERSION};
use credbroker_tests::{
    BROKER_TIMEOUT, Broker, COMMAND_TIMEOUT, Running, TokenFiles, V1, assert_credential,
    assert_shim_error, config_yaml, describe, exec_info, file_provider, require_tool, run,
    run_broker_cli, send_signal, tempdir, wait_until,
};
use serde_json::{Value, json};

/// The two complete overlays and how each delivers the shim.
const OVERLAYS: [(&str, Delivery); 2] = [
    ("deploy/kueue/image-volume", Delivery::ImageVolume),
    ("deploy/kueue/init-copy", Delivery::InitCopy),
];
const EXAMPLE_CLUSTERS: &str = "deploy/examples/clusters";
const MULTIKUEUE_SETUP: &str = "deploy/examples/multikueue-setup";
const PROVIDER_FILE: &str = "deploy/cluster-inventory/credbroker-providers.json";
/// The two Kueue configuration components: (directory, the exec entries' list name).
const KUEUE_CONFIG_COMPONENTS: [(&str, &str); 2] = [
    ("deploy/kueue/components/kueue-config", "accessProviders"),
    OLDER_KUEUE_COMPONENT[0],
];
/// The component users of Kueue v0.15-v0.18 list instead of `kueue-config` (docs/deploy.md,
/// section 3), and its list name, the only one those versions know.
const OLDER_KUEUE_COMPONENT: [(&str, &str); 1] = [(
    "deploy/kueue/components/kueue-config-credentials-providers",
    "credentialsProviders",
)];
/// The Kueue release whose default configuration the older component carries.
const OLDER_KUEUE_VERSION: &str = "v0.17.0";
const WORKER_RBAC: &str = "deploy/examples/worker-rbac";
/// The names the worker RBAC example gives its objects (the real-cluster suite applies it).
const WORKER_RBAC_NAME: &str = "credbroker-multikueue";
const CONTAINERFILE: &str = "deploy/Containerfile";

const NAMESPACE: &str = "kueue-system";
const DEPLOYMENT: &str = "kueue-controller-manager";
const MANAGER: &str = "manager";
const SIDECAR: &str = "credbroker";
const KUEUE_CONFIGMAP: &str = "kueue-manager-config";
const KUEUE_CONFIG_KEY: &str = "controller_manager_config.yaml";
const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
/// The uid of Kueue's manager image (`USER 65532:65532`) and of distroless `nonroot`.
const NONROOT: u32 = 65532;
/// Bound for the image-content script (a cold debug build of both binaries).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What `scripts/image-content.sh` lays out: the image's whole root filesystem, sorted.
const IMAGE_FILES: [&str; 6] = [
    "bin/credbroker",
    "etc/group",
    "etc/passwd",
    "etc/ssl/certs/ca-certificates.crt",
    "plugins/bin/credbroker-shim",
    "usr/share/doc/credbroker/sbom.cdx.json",
];
/// The sidecar's probes. No readinessProbe: a native sidecar's readiness counts toward the
/// pod's, and the pod backs `kueue-webhook-service`, whose webhooks fail closed.
const SIDECAR_PROBES: [&str; 2] = ["startupProbe", "livenessProbe"];
/// The only architecture the image is built for (the workspace targets x86_64-unknown-linux-gnu).
/// The architectures the image index holds (scripts/build-image-index.sh).
const IMAGE_ARCHES: [&str; 2] = ["amd64", "arm64"];
const ARCH_LABEL: &str = "kubernetes.io/arch";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    ImageVolume,
    InitCopy,
}

// ---------------------------------------------------------------------------------------
// Rendering and reading objects
// ---------------------------------------------------------------------------------------

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root")
}

fn kubectl() -> PathBuf {
    require_tool(
        "kubectl",
        "install kubectl (its `kubectl kustomize` renders deploy/)",
    )
}

/// The copy of `deploy/` rendered over Kueue `version`'s own `config/default`
/// ([`credbroker_tests::kueue`]), made once per test process.
fn tree(version: &str) -> PathBuf {
    static TREES: OnceLock<Mutex<BTreeMap<String, PathBuf>>> = OnceLock::new();
    let mut trees = TREES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    trees
        .entry(version.to_owned())
        .or_insert_with(|| {
            let at =
                Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deploy-over-kueue-{version}"));
            kueue::deploy_over_kueue(&repo(), &at, version)
        })
        .clone()
}

/// `kubectl kustomize DIR` (relative to the repo, under `deploy/`) over Kueue
/// [`SHIPPED_KUEUE_VERSION`], the release `deploy/kueue/kueue-install` names.
fn render(dir: &str) -> Vec<Value> {
    render_over(dir, SHIPPED_KUEUE_VERSION)
}

/// Rendered objects by (directory, Kueue version).
type Rendered = BTreeMap<(String, String), Vec<Value>>;

/// `kubectl kustomize DIR` over Kueue `version`'s real manifests, parsed into one JSON value
/// per object (cached: Kueue's manifests are thousands of lines).
fn render_over(dir: &str, version: &str) -> Vec<Value> {
    static RENDERED: OnceLock<Mutex<Rendered>> = OnceLock::new();
    let key = (dir.to_owned(), version.to_owned());
    let cache = RENDERED.get_or_init(Default::default);
    if let Some(objects) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return objects.clone();
    }
    let root = tree(version);
    let out = run(
        Command::new(kubectl()).arg("kustomize").arg(root.join(dir)),
        COMMAND_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} over Kueue {version}: {}",
        describe(&out)
    );
    let text = String::from_utf8(out.stdout).expect("kustomize output is UTF-8");
    let objects = parse_yaml_stream(&text, dir);
    assert!(
        !objects.is_empty(),
        "kubectl kustomize {dir} rendered nothing"
    );
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, objects.clone());
    objects
}

/// Both overlays over every Kueue version the suite verifies: ("DIR over Kueue VERSION",
/// delivery, objects).
fn overlays() -> Vec<(String, Delivery, Vec<Value>)> {
    let mut all = Vec::new();
    for version in KUEUE_VERSIONS {
        for (dir, delivery) in OVERLAYS {
            all.push((
                format!("{dir} over Kueue {version}"),
                delivery,
                render_over(dir, version),
            ));
        }
    }
    all
}

/// A `---`-separated YAML stream (what kustomize prints) as JSON values.
fn parse_yaml_stream(text: &str, what: &str) -> Vec<Value> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line == "---" {
            docs.push(String::new());
        } else {
            let doc = docs.last_mut().expect("at least one doc");
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.iter()
        .filter(|d| !d.trim().is_empty())
        .map(|d| parse_yaml(d, what))
        .collect()
}

fn parse_yaml(text: &str, what: &str) -> Value {
    serde_norway::from_str(text).unwrap_or_else(|e| panic!("{what}: not YAML ({e}):\n{text}"))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| {
            let have: Vec<String> = objects
                .iter()
                .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
                .collect();
            panic!("no {kind} {name} among the rendered objects: {have:?}")
        })
}

fn all<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} should be a string, is {v}"))
}

fn list<'a>(v: &'a Value, what: &str) -> &'a Vec<Value> {
    v.as_array()
        .unwrap_or_else(|| panic!("{what} should be a list, is {v}"))
}

fn strings(v: &Value, what: &str) -> Vec<String> {
    list(v, what)
        .iter()
        .map(|s| str_of(s, what).to_owned())
        .collect()
}

fn named<'a>(items: &'a Value, name: &str, what: &str) -> &'a Value {
    list(items, what)
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {what} named {name:?} in {items}"))
}

/// Kueue's manager pod spec in a rendered overlay.
fn pod_spec(objects: &[Value]) -> &Value {
    let deployment = find(objects, "Deployment", DEPLOYMENT);
    assert_eq!(deployment["metadata"]["namespace"], NAMESPACE);
    &deployment["spec"]["template"]["spec"]
}

fn sidecar(pod: &Value) -> &Value {
    named(&pod["initContainers"], SIDECAR, "init container")
}

fn manager(pod: &Value) -> &Value {
    named(&pod["containers"], MANAGER, "container")
}

fn volume<'a>(pod: &'a Value, name: &str) -> &'a Value {
    named(&pod["volumes"], name, "volume")
}

/// The mount of `container` whose mountPath is `path` or the longest prefix of it:
/// (volume name, mountPath, subPath).
fn mount_for(container: &Value, path: &str) -> (String, String, String) {
    list(&container["volumeMounts"], "volumeMounts")
        .iter()
        .filter_map(|m| {
            let at = m["mountPath"].as_str()?;
            let inside = path == at || path.starts_with(&format!("{}/", at.trim_end_matches('/')));
            inside.then(|| {
                (
                    str_of(&m["name"], "volumeMounts[].name").to_owned(),
                    at.to_owned(),
                    m["subPath"].as_str().unwrap_or("").to_owned(),
                )
            })
        })
        .max_by_key(|(_, at, _)| at.len())
        .unwrap_or_else(|| {
            panic!(
                "container {} mounts nothing at {path}: {}",
                container["name"], container["volumeMounts"]
            )
        })
}

/// `data[key]` of the ConfigMap a volume of `pod` refers to.
fn configmap_file(objects: &[Value], pod: &Value, volume_name: &str, key: &str) -> String {
    let vol = volume(pod, volume_name);
    let cm_name = str_of(
        &vol["configMap"]["name"],
        &format!("volume {volume_name} configMap.name"),
    );
    let cm = find(objects, "ConfigMap", cm_name);
    str_of(
        &cm["data"][key],
        &format!("ConfigMap {cm_name} data[{key:?}]"),
    )
    .to_owned()
}

/// The broker config the sidecar runs: the file named by `serve --config PATH`, read from the
/// ConfigMap mounted over PATH's directory.
fn broker_config_text(objects: &[Value]) -> String {
    let pod = pod_spec(objects);
    let args = strings(&sidecar(pod)["args"], "sidecar args");
    let at = args
        .iter()
        .position(|a| a == "--config")
        .unwrap_or_else(|| panic!("the sidecar runs `serve --config FILE`: {args:?}"));
    assert_eq!(args[0], "serve", "sidecar args: {args:?}");
    let path = args.get(at + 1).expect("--config has a value");
    let (vol, mount_path, sub_path) = mount_for(sidecar(pod), path);
    assert!(
        sub_path.is_empty(),
        "mount the config directory, not a subPath (a subPath never sees ConfigMap updates)"
    );
    let key = path
        .strip_prefix(&format!("{mount_path}/"))
        .unwrap_or_else(|| panic!("{path} is not inside {mount_path}"));
    configmap_file(objects, pod, &vol, key)
}

fn broker_config(objects: &[Value]) -> Value {
    parse_yaml(&broker_config_text(objects), "the broker config")
}

/// Kueue's Configuration as the manager reads it (`--config=FILE`, mounted from a ConfigMap).
fn kueue_config(objects: &[Value]) -> Value {
    parse_yaml(
        &kueue_config_text(objects),
        "Kueue's controller_manager_config.yaml",
    )
}

/// The text of the file Kueue's manager reads as its configuration.
fn kueue_config_text(objects: &[Value]) -> String {
    let pod = pod_spec(objects);
    let args = strings(&manager(pod)["args"], "manager args");
    let path = args
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .unwrap_or_else(|| panic!("the manager runs with --config=FILE: {args:?}"));
    let (vol, _, sub_path) = mount_for(manager(pod), path);
    assert_eq!(
        sub_path, KUEUE_CONFIG_KEY,
        "Kueue mounts its config file by subPath"
    );
    let cm_name = volume(pod, &vol)["configMap"]["name"].clone();
    assert_eq!(
        cm_name, KUEUE_CONFIGMAP,
        "the manager reads {KUEUE_CONFIGMAP}"
    );
    configmap_file(objects, pod, &vol, KUEUE_CONFIG_KEY)
}

/// The exec entries of Kueue's `multiKueue.clusterProfile` (whichever list name is used).
fn kueue_access_providers(kueue: &Value) -> Vec<Value> {
    let cp = &kueue["multiKueue"]["clusterProfile"];
    let access = cp["accessProviders"].as_array();
    let legacy = cp["credentialsProviders"].as_array();
    match (access, legacy) {
        (Some(a), None) | (None, Some(a)) if !a.is_empty() => a.clone(),
        (Some(_), Some(_)) => {
            panic!("Kueue refuses accessProviders and credentialsProviders together: {cp}")
        }
        _ => panic!("multiKueue.clusterProfile has no access providers: {cp}"),
    }
}

/// `--provider NAME` of an exec entry's args.
fn shim_provider(exec: &Value) -> String {
    let args = strings(&exec["args"], "execConfig.args");
    match args.as_slice() {
        [flag, name] if flag == "--provider" => name.clone(),
        _ => panic!("execConfig.args should be [--provider, NAME], is {args:?}"),
    }
}

fn broker_provider<'a>(broker: &'a Value, name: &str) -> &'a Value {
    named(&broker["providers"], name, "broker provider")
}

// ---------------------------------------------------------------------------------------
// Every kustomization renders
// ---------------------------------------------------------------------------------------

fn kustomizations(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read deploy/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            kustomizations(&path, found);
        } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
            found.push(path);
        }
    }
}

#[test]
fn every_kustomization_under_deploy_renders() {
    let root = repo();
    let mut files = Vec::new();
    kustomizations(&root.join("deploy"), &mut files);
    files.sort();
    let mut components = BTreeSet::new();
    let mut used_components = BTreeSet::new();
    let mut rendered = 0;
    for file in &files {
        let dir = file.parent().expect("parent").to_path_buf();
        let rel = dir
            .strip_prefix(&root)
            .expect("under the repo")
            .to_str()
            .expect("UTF-8")
            .to_owned();
        let k = parse_yaml(
            &std::fs::read_to_string(file).expect("read kustomization"),
            &rel,
        );
        if k["kind"] == "Component" {
            components.insert(dir.clone());
            continue;
        }
        for c in k["components"].as_array().into_iter().flatten() {
            let c = dir
                .join(str_of(c, "components[]"))
                .canonicalize()
                .expect("component dir exists");
            used_components.insert(c);
        }
        let objects = render(&rel);
        for o in &objects {
            assert!(
                o["apiVersion"].is_string()
                    && o["kind"].is_string()
                    && o["metadata"]["name"].is_string(),
                "{rel} rendered an object without apiVersion/kind/name: {o}"
            );
        }
        rendered += 1;
    }
    assert!(
        rendered >= 2 + 3 + 2,
        "expected the two overlays, three identity examples and two example sets, rendered {rendered}: {files:?}"
    );
    // Components that only a user's own kustomization lists, rendered by the tests of
    // docs/deploy.md, section 3 (`older_kueue_loads_the_credentials_providers_component`).
    for (component, _) in OLDER_KUEUE_COMPONENT {
        used_components.insert(
            root.join(component)
                .canonicalize()
                .expect("component dir exists"),
        );
    }
    let unused: Vec<_> = components.difference(&used_components).collect();
    assert!(
        unused.is_empty(),
        "components no rendered kustomization uses (so never rendered): {unused:?}"
    );
}

/// The shipped `kueue-install` is Kueue's release manifest of the version the tests render
/// over in its place (and the one `components/kueue-config` carries the default config of).
#[test]
fn kueue_install_names_the_release_the_tests_render_over() {
    let file = "deploy/kueue/kueue-install/kustomization.yaml";
    let k = parse_yaml(
        &std::fs::read_to_string(repo().join(file)).expect("read kueue-install"),
        file,
    );
    assert_eq!(
        strings(&k["resources"], "resources"),
        [format!(
            "https://github.com/kubernetes-sigs/kueue/releases/download/{SHIPPED_KUEUE_VERSION}/manifests.yaml"
        )],
        "{file}"
    );
    assert!(KUEUE_VERSIONS.contains(&SHIPPED_KUEUE_VERSION));
    let config = std::fs::read_to_string(
        repo().join("deploy/kueue/components/kueue-config/controller_manager_config.yaml"),
    )
    .expect("read the Kueue config");
    assert!(
        config.contains(&format!(
            "Kueue {SHIPPED_KUEUE_VERSION}'s default configuration"
        )),
        "components/kueue-config carries Kueue {SHIPPED_KUEUE_VERSION}'s configuration"
    );
}

// ---------------------------------------------------------------------------------------
// The user's own kustomization (docs/deploy.md, section 3)
// ---------------------------------------------------------------------------------------

/// The directory docs/deploy.md's own kustomization lives in, beside `../credbroker`.
const USER_DIR: &str = "my-kueue";

/// The files of the user's kustomization as docs/deploy.md shows them: every fenced block
/// whose first line is `# my-kueue/PATH` (optionally followed by `:` and a note), by PATH.
fn user_files_from_deploy_md() -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    for block in blocks_of(&repo(), "docs/deploy.md") {
        let first = block.body.lines().next().unwrap_or("");
        let Some(rest) = first.strip_prefix(&format!("# {USER_DIR}/")) else {
            continue;
        };
        let path = rest.split(':').next().expect("a path").trim().to_owned();
        assert!(
            files.insert(path.clone(), block.body.clone()).is_none(),
            "{}: a second block for {USER_DIR}/{path}",
            block.at()
        );
    }
    files
}

/// Uncomments the lines of `text` that contain `marker` (`# ` after the indentation).
fn uncomment(text: &str, marker: &str) -> String {
    let mut found = false;
    let out: String = text
        .lines()
        .map(|line| {
            let indent = line.len() - line.trim_start().len();
            match line[indent..].strip_prefix("# ") {
                Some(rest) if line.contains(marker) => {
                    found = true;
                    format!("{}{rest}\n", &line[..indent])
                }
                _ => format!("{line}\n"),
            }
        })
        .collect();
    assert!(found, "no commented line with {marker:?} in:\n{text}");
    out
}

/// Item 3 of issue 23: the one supported way to give the broker your own config. The three
/// files are rendered as docs/deploy.md writes them (the Kueue release URL replaced by the same
/// release's config/default, offline), with metrics off and on and with either shim
/// component: the broker gets the user's credbroker.yaml byte for byte every time.
#[test]
fn users_own_config_survives_turning_components_on_and_off() {
    let files = user_files_from_deploy_md();
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "credbroker-config/credbroker.yaml",
            "credbroker-config/kustomization.yaml",
            "kustomization.yaml"
        ],
        "docs/deploy.md shows {USER_DIR}/'s files"
    );
    let release = format!(
        "https://github.com/kubernetes-sigs/kueue/releases/download/{SHIPPED_KUEUE_VERSION}/manifests.yaml"
    );
    let kustomization = &files["kustomization.yaml"];
    assert!(
        kustomization.contains(&format!("  - {release}\n")),
        "{USER_DIR}/kustomization.yaml names Kueue {SHIPPED_KUEUE_VERSION}'s release manifest"
    );
    let config = &files["credbroker-config/credbroker.yaml"];

    let tmp = tempdir();
    kueue::deploy_over_kueue(
        &repo(),
        &tmp.path().join("credbroker"),
        SHIPPED_KUEUE_VERSION,
    );
    let user = tmp.path().join(USER_DIR);
    std::fs::create_dir_all(user.join("credbroker-config")).expect("mkdir");
    let kueue_default = kueue::relative_path(
        &user,
        &kueue::kueue_dir(SHIPPED_KUEUE_VERSION).join("config/default"),
    );
    let offline = kustomization.replace(&release, kueue_default.to_str().expect("UTF-8"));

    let metrics_on = uncomment(&offline, "components/credbroker-metrics");
    // The same `images:` for either shim component: init copy runs the credbroker image too.
    let init_copy = offline.replace("shim-image-volume", "shim-init-copy");
    let cases = [
        ("as written", offline.clone(), config.clone(), false),
        (
            "with credbroker-metrics and metrics.address",
            metrics_on,
            uncomment(config, "metrics:"),
            true,
        ),
        ("with shim-init-copy", init_copy, config.clone(), false),
    ];
    for (case, kustomization, config, metrics) in cases {
        for (path, text) in [
            ("kustomization.yaml", kustomization.as_str()),
            (
                "credbroker-config/kustomization.yaml",
                files["credbroker-config/kustomization.yaml"].as_str(),
            ),
            ("credbroker-config/credbroker.yaml", config.as_str()),
        ] {
            std::fs::write(user.join(path), text).expect("write a file of the user's overlay");
        }
        let out = run(
            Command::new(kubectl()).arg("kustomize").arg(&user),
            COMMAND_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "{case}: kubectl kustomize {USER_DIR}: {}",
            describe(&out)
        );
        let objects = parse_yaml_stream(&String::from_utf8_lossy(&out.stdout), case);
        let configs: Vec<_> = all(&objects, "ConfigMap")
            .into_iter()
            .filter(|c| str_of(&c["metadata"]["name"], "name").starts_with("credbroker-config"))
            .collect();
        assert_eq!(configs.len(), 1, "{case}: one broker ConfigMap");
        assert_eq!(
            broker_config_text(&objects),
            config,
            "{case}: the broker runs the user's credbroker.yaml, byte for byte"
        );
        let cfg = tmp.path().join("config.yaml");
        std::fs::write(&cfg, &config).expect("write config");
        let checked = run_broker_cli(&["check-config".as_ref(), cfg.as_os_str()]);
        assert!(checked.status.success(), "{case}: {}", describe(&checked));
        let pod = pod_spec(&objects);
        let image = str_of(&sidecar(pod)["image"], "sidecar image");
        assert_eq!(image, "REGISTRY/credbroker:TAG", "{case}");
        for (what, other) in credbroker_images(pod) {
            assert_eq!(
                other, image,
                "{case}: {what} runs the user's credbroker image"
            );
        }
        let ports = sidecar(pod)["ports"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let address = parse_yaml(&config, case)["metrics"]["address"].clone();
        if metrics {
            let port: u64 = str_of(&address, "metrics.address")
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok())
                .expect("HOST:PORT");
            assert!(
                ports
                    .iter()
                    .any(|p| p["containerPort"].as_u64() == Some(port)),
                "{case}: the sidecar declares the port the user's config listens on: {ports:?}"
            );
            find(&objects, "PodMonitor", "credbroker");
        } else {
            assert!(
                address.is_null() && ports.is_empty(),
                "{case}: metrics stay off"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// The sidecar
// ---------------------------------------------------------------------------------------

#[test]
fn sidecar_is_a_hardened_native_sidecar_sharing_the_socket_with_the_manager() {
    for (dir, _, objects) in overlays() {
        let pod = pod_spec(&objects);
        let side = sidecar(pod);
        let mgr = manager(pod);
        let ctx = format!("{dir}: sidecar {side}");

        assert_eq!(
            side["restartPolicy"], "Always",
            "a native sidecar is an init container with restartPolicy Always: {ctx}"
        );
        let image = str_of(&side["image"], "sidecar image");
        assert!(
            image.contains('/') && image.contains(':'),
            "the overlay's `images:` sets the sidecar image (REGISTRY/credbroker:TAG), got {image:?}"
        );

        // Hardened: per container, or inherited from the pod.
        let sc = |key: &str| {
            let own = &side["securityContext"][key];
            if own.is_null() {
                pod["securityContext"][key].clone()
            } else {
                own.clone()
            }
        };
        assert_eq!(sc("runAsNonRoot"), true, "{ctx}");
        assert_eq!(sc("allowPrivilegeEscalation"), false, "{ctx}");
        assert_eq!(sc("readOnlyRootFilesystem"), true, "{ctx}");
        assert_eq!(sc("seccompProfile")["type"], "RuntimeDefault", "{ctx}");
        assert!(
            strings(&sc("capabilities")["drop"], "capabilities.drop").contains(&"ALL".to_owned()),
            "{ctx}"
        );
        for bound in ["requests", "limits"] {
            for resource in ["cpu", "memory"] {
                assert!(
                    side["resources"][bound][resource].is_string(),
                    "sidecar resources.{bound}.{resource} must be set: {ctx}"
                );
            }
        }

        // The socket: the broker config's socket.path is inside an emptyDir the sidecar mounts,
        // and the manager mounts the same volume at the same path (the shim's default socket).
        let broker = broker_config(&objects);
        let socket = str_of(&broker["socket"]["path"], "socket.path");
        assert_eq!(
            socket, "/var/run/credbroker/broker.sock",
            "the shim's default socket, so Kueue's exec entries need no --socket"
        );
        let (side_vol, side_at, side_sub) = mount_for(side, socket);
        let (mgr_vol, mgr_at, mgr_sub) = mount_for(mgr, socket);
        assert_eq!(
            (&side_vol, &side_at, &side_sub),
            (&mgr_vol, &mgr_at, &mgr_sub),
            "{dir}: sidecar and manager must see the socket through one volume at one path"
        );
        assert!(
            volume(pod, &side_vol)["emptyDir"].is_object(),
            "{dir}: the socket volume is an emptyDir: {}",
            volume(pod, &side_vol)
        );
        let side_mount = list(&side["volumeMounts"], "volumeMounts")
            .iter()
            .find(|m| m["name"] == side_vol.as_str())
            .expect("socket mount");
        assert_ne!(
            side_mount["readOnly"], true,
            "{dir}: the broker creates the socket, so its mount is writable"
        );

        // The probes: `credbroker health` from the sidecar's own image, over the socket the
        // broker config names, bounded before the kubelet's own timeout.
        let socket_path = str_of(&broker["socket"]["path"], "socket.path");
        for probe in SIDECAR_PROBES {
            let command = strings(
                &side[probe]["exec"]["command"],
                &format!("{probe}.exec.command"),
            );
            assert_eq!(
                command[..2],
                ["/bin/credbroker", "health"],
                "{dir}: {probe} runs the image's broker health check: {command:?}"
            );
            let flag = |name: &str| {
                command
                    .iter()
                    .position(|a| a == name)
                    .map(|i| command[i + 1].clone())
            };
            assert_eq!(
                flag("--socket").as_deref(),
                Some(socket_path),
                "{dir}: {probe} checks the broker's socket"
            );
            let timeout = side[probe]["timeoutSeconds"].as_u64().unwrap_or(1);
            let check_timeout = flag("--timeout")
                .map(|t| {
                    t.trim_end_matches('s')
                        .parse::<u64>()
                        .expect("--timeout Ns")
                })
                .expect("probes bound the check with --timeout");
            assert!(
                check_timeout < timeout,
                "{dir}: {probe}: --timeout ({check_timeout}s) must end before the probe's timeoutSeconds ({timeout}s)"
            );
        }
        let allowed: Vec<u64> = list(&broker["socket"]["allowedUids"], "allowedUids")
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        assert!(
            allowed.contains(&u64::from(NONROOT)),
            "{dir}: allowedUids {allowed:?} must admit Kueue's manager (uid {NONROOT})"
        );
    }
}

/// Item 8 of issue 13: the sidecar's readiness must not depend on credentials. Kueue's manager
/// pod backs its webhook Service (`failurePolicy: Fail`): a sidecar readinessProbe failing on a
/// NOT_SERVING broker would take the pod out of the endpoints and refuse every Job cluster-wide.
#[test]
fn sidecar_probes_gate_startup_and_liveness_but_never_the_pods_readiness() {
    for (dir, _, objects) in overlays() {
        let side = sidecar(pod_spec(&objects));
        assert!(
            side["readinessProbe"].is_null(),
            "{dir}: a sidecar readinessProbe counts toward the pod's readiness (Kueue's webhooks): {}",
            side["readinessProbe"]
        );
        for probe in SIDECAR_PROBES {
            let command = strings(
                &side[probe]["exec"]["command"],
                &format!("{dir}: {probe}.exec.command"),
            );
            assert_eq!(
                command[..2],
                ["/bin/credbroker", "health"],
                "{dir}: {probe}"
            );
        }
        // The manager starts only after the socket exists: the startup probe gates it, and
        // keeps trying long enough for a slow node (at least 10 s).
        let startup = &side["startupProbe"];
        let budget = startup["periodSeconds"].as_u64().unwrap_or(10)
            * startup["failureThreshold"].as_u64().unwrap_or(3);
        assert!(budget >= 10, "{dir}: startupProbe gives up after {budget}s");
    }
}

/// Item 9 of issue 13 pinned the pod to amd64, the only architecture then built. The image is
/// now an index of amd64 and arm64 (issue 21), so the overlays pin nothing, and Kueue's own
/// node selection (nodeSelector and affinity) is what schedules the pod.
#[test]
fn pods_are_not_pinned_to_one_architecture_and_kueues_node_selection_is_kept() {
    for (dir, _, objects) in overlays() {
        let pod = pod_spec(&objects);
        assert!(
            pod["nodeSelector"].get(ARCH_LABEL).is_none(),
            "{dir}: the image runs on {IMAGE_ARCHES:?}; no pin to one: {}",
            pod["nodeSelector"]
        );
    }

    // A Kueue installation that already selects nodes (nodeSelector and affinity) keeps them.
    let tmp = tempdir();
    let base = tmp.path().join("kueue");
    let overlay = tmp.path().join("overlay");
    std::fs::create_dir_all(&base).expect("mkdir");
    std::fs::create_dir_all(&overlay).expect("mkdir");
    let kueue_install = kueue::relative_path(
        &base,
        &tree(SHIPPED_KUEUE_VERSION).join("deploy/kueue/kueue-install"),
    );
    std::fs::write(
        base.join("kustomization.yaml"),
        format!(
            r#"resources:
  - {}
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {{name: {DEPLOYMENT}, namespace: {NAMESPACE}}}
      spec:
        template:
          spec:
            nodeSelector: {{node-role.example.com/system: "true"}}
            affinity:
              nodeAffinity:
                requiredDuringSchedulingIgnoredDuringExecution:
                  nodeSelectorTerms:
                    - matchExpressions:
                        - {{key: kubernetes.io/os, operator: In, values: [linux]}}
"#,
            kueue_install.display()
        ),
    )
    .expect("write base");
    let components = kueue::relative_path(&overlay, &repo().join("deploy/kueue/components"));
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "resources:
  - ../kueue
components:
  - {}
  - {}
",
            components.join("credbroker-sidecar").display(),
            components.join("shim-image-volume").display()
        ),
    )
    .expect("write overlay");
    let out = run(
        Command::new(kubectl()).arg("kustomize").arg(&overlay),
        COMMAND_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        describe(&out)
    );
    let objects = parse_yaml_stream(&String::from_utf8_lossy(&out.stdout), "custom overlay");
    let pod = pod_spec(&objects);
    assert!(
        pod["nodeSelector"].get(ARCH_LABEL).is_none(),
        "{}",
        pod["nodeSelector"]
    );
    assert_eq!(
        pod["nodeSelector"]["node-role.example.com/system"], "true",
        "Kueue's own nodeSelector is kept: {}",
        pod["nodeSelector"]
    );
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "kubernetes.io/os",
        "Kueue's own affinity is kept: {}",
        pod["affinity"]
    );
}

#[test]
fn broker_config_in_the_configmap_passes_check_config() {
    for (dir, _, objects) in overlays() {
        let tmp = tempdir();
        let file = tmp.path().join("config.yaml");
        std::fs::write(&file, broker_config_text(&objects)).expect("write config");
        let out = run_broker_cli(&["check-config".as_ref(), file.as_os_str()]);
        assert!(
            out.status.success(),
            "{dir}: credbroker check-config on the rendered ConfigMap: {}",
            describe(&out)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        for p in list(&broker_config(&objects)["providers"], "providers") {
            let name = str_of(&p["name"], "provider name");
            assert!(
                stdout.contains(name),
                "{dir}: check-config lists {name}: {stdout}"
            );
        }

        // And the check bites: an unknown key in the same file is refused, naming its path.
        let broken =
            broker_config_text(&objects).replacen("cache:\n", "cache:\n  bogusKey: 1\n", 1);
        std::fs::write(&file, broken).expect("write config");
        let out = run_broker_cli(&["check-config".as_ref(), file.as_os_str()]);
        assert!(
            !out.status.success(),
            "{dir}: a bogus key must fail: {}",
            describe(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("cache.bogusKey"),
            "{}",
            describe(&out)
        );
    }
}

// ---------------------------------------------------------------------------------------
// Kueue's configuration and the provider file
// ---------------------------------------------------------------------------------------

#[test]
fn kueue_config_runs_the_shim_with_cluster_info() {
    for (dir, _, objects) in overlays() {
        let kueue = kueue_config(&objects);
        let broker = broker_config(&objects);
        assert_eq!(
            kueue["apiVersion"], "config.kueue.x-k8s.io/v1beta2",
            "{dir}"
        );
        assert_eq!(kueue["kind"], "Configuration", "{dir}");
        assert_eq!(
            kueue["featureGates"]["MultiKueueClusterProfile"], true,
            "{dir}: MultiKueue ignores ClusterProfiles without this gate"
        );
        let manager_args = strings(&manager(pod_spec(&objects))["args"], "manager args");
        assert!(
            !manager_args
                .iter()
                .any(|a| a.starts_with("--feature-gates")),
            "{dir}: Kueue refuses featureGates in its config together with --feature-gates"
        );
        let entries = kueue_access_providers(&kueue);
        let mut names = BTreeSet::new();
        for entry in &entries {
            let name = str_of(&entry["name"], "access provider name");
            assert!(
                names.insert(name.to_owned()),
                "{dir}: duplicate entry {name}"
            );
            let exec = &entry["execConfig"];
            let ctx = format!("{dir}: entry {name}: {exec}");
            assert_eq!(exec["apiVersion"], V1, "{ctx}");
            assert_eq!(exec["command"], "/plugins/bin/credbroker-shim", "{ctx}");
            assert_eq!(
                exec["provideClusterInfo"], true,
                "without provideClusterInfo no per-cluster input reaches the shim: {ctx}"
            );
            assert_eq!(exec["interactiveMode"], "Never", "Kueue requires it: {ctx}");
            assert!(
                exec["env"].is_null(),
                "the shim needs no env (default socket): {ctx}"
            );
            let provider = shim_provider(exec);
            let p = broker_provider(&broker, &provider);
            assert!(p["type"].is_string(), "{ctx}");
        }
        // Every workload provider of the broker is reachable from Kueue.
        let asked: BTreeSet<String> = entries
            .iter()
            .map(|e| shim_provider(&e["execConfig"]))
            .collect();
        for p in list(&broker["providers"], "providers") {
            let name = str_of(&p["name"], "provider name");
            assert!(
                asked.contains(name),
                "{dir}: no Kueue entry asks broker provider {name}"
            );
        }
    }
}

#[test]
fn cluster_inventory_provider_file_matches_the_kueue_config() {
    let text = std::fs::read_to_string(repo().join(PROVIDER_FILE)).expect("read provider file");
    let file: Value = serde_json::from_str(&text).expect("the provider file is JSON");
    let providers = list(&file["providers"], "providers");
    let kueue = kueue_config(&render(OVERLAYS[0].0));
    let entries = kueue_access_providers(&kueue);
    assert_eq!(
        providers.len(),
        entries.len(),
        "one provider-file entry per Kueue entry"
    );
    for (file_entry, kueue_entry) in providers.iter().zip(&entries) {
        assert_eq!(file_entry["name"], kueue_entry["name"]);
        // The file is read by encoding/json into clientcmd's ExecConfig: exactly its JSON names.
        let keys: BTreeSet<&str> = file_entry["execConfig"]
            .as_object()
            .expect("execConfig object")
            .keys()
            .map(String::as_str)
            .collect();
        let known: BTreeSet<&str> = [
            "command",
            "args",
            "env",
            "apiVersion",
            "installHint",
            "provideClusterInfo",
            "interactiveMode",
        ]
        .into();
        assert!(keys.is_subset(&known), "unknown execConfig keys: {keys:?}");
        assert_eq!(
            file_entry["execConfig"], kueue_entry["execConfig"],
            "provider {} differs between {PROVIDER_FILE} and the Kueue config",
            file_entry["name"]
        );
    }
}

// ---------------------------------------------------------------------------------------
// Examples
// ---------------------------------------------------------------------------------------

/// The per-cluster keys a broker provider still needs from a cluster's exec extension, given
/// what the provider's own config sets as defaults.
fn missing_keys(provider: &Value, extension: &Value) -> Vec<&'static str> {
    let has = |key: &str| extension[key].as_str().is_some_and(|s| !s.is_empty());
    let mut missing = Vec::new();
    match str_of(&provider["type"], "provider type") {
        "aws" => {
            if !has("clusterName") {
                missing.push("clusterName");
            }
            if !has("region") && provider["aws"]["region"].is_null() {
                missing.push("region");
            }
        }
        "azure" => {
            if !has("serverId") && provider["azure"]["serverId"].is_null() {
                missing.push("serverId");
            }
        }
        "file" => {
            let path = str_of(&provider["file"]["path"], "file.path");
            if path.contains("{clusterName}") && !has("clusterName") {
                missing.push("clusterName");
            }
        }
        "exec" | "gcp" => {}
        other => panic!("no rule for provider type {other}"),
    }
    missing
}

fn exec_extension(cluster: &Value) -> Value {
    cluster["extensions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == EXEC_EXTENSION)
        .map(|e| e["extension"].clone())
        .unwrap_or_else(|| json!({}))
}

#[test]
fn missing_keys_names_what_a_cluster_lacks() {
    let aws_no_default = json!({"name": "eks", "type": "aws"});
    assert_eq!(
        missing_keys(&aws_no_default, &json!({})),
        ["clusterName", "region"]
    );
    assert_eq!(
        missing_keys(
            &aws_no_default,
            &json!({"clusterName": "a", "region": "eu-west-1"})
        ),
        Vec::<&str>::new()
    );
    let file = json!({"name": "f", "type": "file", "file": {"path": "/t/{clusterName}"}});
    assert_eq!(
        missing_keys(&file, &json!({"region": "x"})),
        ["clusterName"]
    );
    let azure = json!({"name": "a", "type": "azure", "azure": {}});
    assert_eq!(missing_keys(&azure, &json!({})), ["serverId"]);
}

#[test]
fn example_cluster_profiles_carry_what_their_provider_needs() {
    let overlay = render(OVERLAYS[0].0);
    let kueue = kueue_config(&overlay);
    let broker = broker_config(&overlay);
    let entries: BTreeMap<String, String> = kueue_access_providers(&kueue)
        .iter()
        .map(|e| {
            (
                str_of(&e["name"], "name").to_owned(),
                shim_provider(&e["execConfig"]),
            )
        })
        .collect();

    let examples = render(EXAMPLE_CLUSTERS);
    let profiles = all(&examples, "ClusterProfile");
    let mut types = BTreeSet::new();
    for cp in &profiles {
        let name = str_of(&cp["metadata"]["name"], "ClusterProfile name");
        assert_eq!(cp["apiVersion"], "multicluster.x-k8s.io/v1alpha1", "{name}");
        assert_eq!(
            cp["metadata"]["namespace"], NAMESPACE,
            "{name}: Kueue looks ClusterProfiles up in its own namespace"
        );
        assert!(
            cp["spec"]["clusterManager"]["name"].is_string(),
            "{name}: spec.clusterManager.name is required"
        );
        let providers = list(&cp["status"]["accessProviders"], "status.accessProviders");
        assert!(!providers.is_empty(), "{name}");
        for ap in providers {
            let ap_name = str_of(&ap["name"], "accessProviders[].name");
            let broker_name = entries.get(ap_name).unwrap_or_else(|| {
                panic!("{name}: access provider {ap_name} has no Kueue entry ({entries:?})")
            });
            let provider = broker_provider(&broker, broker_name);
            types.insert(str_of(&provider["type"], "type").to_owned());
            let cluster = &ap["cluster"];
            let server = str_of(&cluster["server"], "cluster.server");
            assert!(
                server.starts_with("https://"),
                "{name}: client-go runs exec plugins only for https servers: {server}"
            );
            let ca = str_of(
                &cluster["certificate-authority-data"],
                "certificate-authority-data",
            );
            base64::engine::general_purpose::STANDARD
                .decode(ca)
                .unwrap_or_else(|e| {
                    panic!("{name}: certificate-authority-data is not base64: {e}")
                });
            let extension = exec_extension(cluster);
            // As every provider doc writes its extension: clusterName names the cluster in the
            // broker's log lines and errors, whatever the provider needs (issue 23.5: the GKE
            // example had none while gcp.md and README put it there).
            assert!(
                extension["clusterName"].is_string(),
                "{name}: the exec extension carries clusterName, as the docs' examples do: {extension}"
            );
            let missing = missing_keys(provider, &extension);
            assert!(
                missing.is_empty(),
                "{name}: provider {broker_name} ({}) needs {missing:?} in the {EXEC_EXTENSION} extension, has {extension}",
                provider["type"]
            );
        }
    }
    assert_eq!(
        types,
        ["aws", "azure", "file", "gcp"].map(str::to_owned).into(),
        "one example per provider type (EKS, GKE, AKS, on-prem)"
    );

    let profile_names: BTreeSet<&str> = profiles
        .iter()
        .map(|cp| str_of(&cp["metadata"]["name"], "name"))
        .collect();
    let clusters = all(&examples, "MultiKueueCluster");
    assert_eq!(
        clusters.len(),
        profiles.len(),
        "a MultiKueueCluster per ClusterProfile"
    );
    let mut cluster_names = BTreeSet::new();
    for mkc in &clusters {
        assert_eq!(mkc["apiVersion"], "kueue.x-k8s.io/v1beta2");
        let source = &mkc["spec"]["clusterSource"];
        assert!(
            source["kubeConfig"].is_null(),
            "exactly one of kubeConfig, clusterProfileRef"
        );
        let target = str_of(
            &source["clusterProfileRef"]["name"],
            "clusterProfileRef.name",
        );
        assert!(
            profile_names.contains(target),
            "{mkc}: no ClusterProfile {target}"
        );
        cluster_names.insert(str_of(&mkc["metadata"]["name"], "name").to_owned());
    }

    let setup = render(MULTIKUEUE_SETUP);
    let config = all(&setup, "MultiKueueConfig");
    assert_eq!(config.len(), 1);
    for c in strings(&config[0]["spec"]["clusters"], "spec.clusters") {
        assert!(
            cluster_names.contains(&c),
            "MultiKueueConfig lists unknown cluster {c}"
        );
    }
    let check = all(&setup, "AdmissionCheck");
    assert_eq!(
        check[0]["spec"]["controllerName"],
        "kueue.x-k8s.io/multikueue"
    );
    assert_eq!(
        check[0]["spec"]["parameters"]["name"],
        config[0]["metadata"]["name"]
    );
}

#[test]
fn identity_examples_wire_the_managers_service_account() {
    let cases = [
        (
            "deploy/examples/identity/aws-irsa",
            "eks.amazonaws.com/role-arn",
            None,
        ),
        (
            "deploy/examples/identity/gke-workload-identity",
            "iam.gke.io/gcp-service-account",
            None,
        ),
        (
            "deploy/examples/identity/azure-workload-identity",
            "azure.workload.identity/client-id",
            Some("azure.workload.identity/use"),
        ),
    ];
    for (dir, annotation, pod_label) in cases {
        let objects = render(dir);
        let pod = pod_spec(&objects);
        let sa_name = str_of(&pod["serviceAccountName"], "serviceAccountName");
        let sa = find(&objects, "ServiceAccount", sa_name);
        assert!(
            sa["metadata"]["annotations"][annotation].is_string(),
            "{dir}: ServiceAccount {sa_name} lacks {annotation}: {sa}"
        );
        let _ = sidecar(pod);
        if let Some(label) = pod_label {
            let deployment = find(&objects, "Deployment", DEPLOYMENT);
            assert_eq!(
                deployment["spec"]["template"]["metadata"]["labels"][label], "true",
                "{dir}: the webhook mutates only pods labelled {label}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// The image content
// ---------------------------------------------------------------------------------------

fn script() -> PathBuf {
    repo().join("scripts/image-content.sh")
}

/// The script's output with the debug profile, built once per test process.
fn image_content() -> &'static Path {
    static CONTENT: OnceLock<PathBuf> = OnceLock::new();
    CONTENT.get_or_init(|| {
        require_tool("readelf", "install binutils");
        let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deploy-image-content");
        let out = run(
            Command::new(script())
                .args(["--profile", "debug", "--out"])
                .arg(&out_dir),
            SCRIPT_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "scripts/image-content.sh --profile debug: {}",
            describe(&out)
        );
        out_dir
    })
}

/// A fresh empty root holding a copy of the image content.
fn image_root() -> tempfile::TempDir {
    let root = tempdir();
    let out = run(
        Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", image_content().display()))
            .arg(root.path()),
        COMMAND_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "copy image content: {}",
        describe(&out)
    );
    root
}

fn files_under(dir: &Path, base: &Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files_under(&path, base, found);
        } else {
            found.push(
                path.strip_prefix(base)
                    .expect("under base")
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
}

/// `chroot [--userspec=UID:UID] ROOT CMD...`; needs root (CAP_SYS_CHROOT and setuid), as the
/// test suite runs (scripts/test.sh).
fn chroot_command(root: &Path, uid: Option<u32>, cmd: &[&str]) -> Command {
    chroot_command_as(
        root,
        &uid.map(|u| format!("{u}:{u}")).unwrap_or_default(),
        cmd,
    )
}

/// Like [`chroot_command`] with a `USER:GROUP` userspec (empty: stay root).
fn chroot_command_as(root: &Path, userspec: &str, cmd: &[&str]) -> Command {
    let mut command = Command::new(require_tool("chroot", "coreutils chroot"));
    if !userspec.is_empty() {
        command.arg(format!("--userspec={userspec}"));
    }
    command.arg(root).args(cmd).env_clear().env("PATH", "/bin");
    command
}

fn chroot(root: &Path, uid: Option<u32>, cmd: &[&str], env: &[(&str, &str)]) -> Output {
    chroot_as(
        root,
        &uid.map(|u| format!("{u}:{u}")).unwrap_or_default(),
        cmd,
        env,
    )
}

fn chroot_as(root: &Path, userspec: &str, cmd: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = chroot_command_as(root, userspec, cmd);
    command.envs(env.iter().copied());
    let out = run(&mut command, COMMAND_TIMEOUT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.starts_with("chroot:"),
        "chroot failed (these tests run as root, like scripts/test.sh): {}",
        describe(&out)
    );
    out
}

#[test]
fn image_content_script_lays_out_static_binaries_that_run_in_an_empty_root() {
    let content = image_content();
    let mut files = Vec::new();
    files_under(content, content, &mut files);
    files.sort();
    assert_eq!(
        files, IMAGE_FILES,
        "the image holds exactly the two binaries, a CA bundle and the user database"
    );
    let passwd = std::fs::read_to_string(content.join("etc/passwd")).expect("passwd");
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with(&format!("nonroot:x:{NONROOT}:{NONROOT}:"))),
        "/etc/passwd names uid {NONROOT}: {passwd}"
    );
    let group = std::fs::read_to_string(content.join("etc/group")).expect("group");
    assert!(
        group
            .lines()
            .any(|l| l.starts_with(&format!("nonroot:x:{NONROOT}:"))),
        "/etc/group names gid {NONROOT}: {group}"
    );
    let ca = std::fs::read_to_string(content.join("etc/ssl/certs/ca-certificates.crt"))
        .expect("CA bundle");
    assert!(
        ca.matches("-----BEGIN CERTIFICATE-----").count() > 10,
        "the CA bundle holds the public roots"
    );
    for f in &files {
        let mode = content
            .join(f)
            .metadata()
            .expect("stat")
            .permissions()
            .mode();
        let want = if f.contains("bin/") { 0o755 } else { 0o644 };
        assert_eq!(mode & 0o777, want, "{f}: mode {mode:o}");
    }
    let readelf = require_tool("readelf", "install binutils");
    for f in files.iter().filter(|f| f.contains("bin/")) {
        let path = content.join(f);
        let mode = path.metadata().expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{f}: mode {mode:o}");
        let out = run(
            Command::new(&readelf).arg("-lW").arg(&path),
            COMMAND_TIMEOUT,
        );
        assert!(out.status.success(), "readelf {f}: {}", describe(&out));
        let headers = String::from_utf8_lossy(&out.stdout);
        assert!(headers.contains("Program Headers:"), "{headers}");
        assert!(
            !headers.contains("INTERP"),
            "{f} is dynamically linked:\n{headers}"
        );
    }

    // An empty root: nothing but the image content (no libc, no shell, no /proc).
    let root = image_root();
    let out = chroot(
        root.path(),
        Some(NONROOT),
        &["/bin/credbroker", "version"],
        &[],
    );
    assert!(
        out.status.success(),
        "credbroker version in a chroot: {}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("credbroker "),
        "{}",
        describe(&out)
    );
    let out = chroot(
        root.path(),
        Some(NONROOT),
        &["/plugins/bin/credbroker-shim", "--version"],
        &[],
    );
    assert!(
        out.status.success(),
        "credbroker-shim --version in a chroot: {}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("credbroker-shim "),
        "{}",
        describe(&out)
    );
}

#[test]
fn image_content_script_refuses_a_directory_it_did_not_write() {
    let dir = tempdir();
    let stray = dir.path().join("keep-me");
    std::fs::write(&stray, "not ours").expect("write");
    let out = run(
        Command::new(script())
            .args(["--profile", "debug", "--out"])
            .arg(dir.path()),
        COMMAND_TIMEOUT,
    );
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("did not write"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&stray).expect("still there"),
        "not ours"
    );
    let out = run(Command::new(script()).arg("--bogus"), COMMAND_TIMEOUT);
    assert!(!out.status.success(), "{}", describe(&out));
}

#[test]
fn containerfile_copies_the_script_output_onto_an_empty_base() {
    let text = std::fs::read_to_string(repo().join(CONTAINERFILE)).expect("read Containerfile");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let stages: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .copied()
        .collect();
    let last = stages.last().expect("a FROM");
    assert!(
        last.starts_with("FROM scratch "),
        "the default (last) stage is the script's output on an empty base, as scripts/build-image.sh builds it: {last}"
    );
    assert!(
        lines.contains(&"scripts/image-content.sh --profile release --out /image-content"),
        "the build stage runs the tested script: {lines:?}"
    );
    // The build stage's base is an argument (the tests build this file on a local base,
    // tests/tests/image.rs), the official Rust image by default.
    assert!(
        lines.contains(&"ARG RUST_IMAGE=docker.io/library/rust:1-bookworm")
            && stages.contains(&"FROM ${RUST_IMAGE} AS build"),
        "{stages:?}"
    );
    // What the scripts need beyond that image: jq (scripts/sbom.sh), readelf (binutils) and
    // cargo-auditable at the version scripts/test.sh installs.
    let test_sh = std::fs::read_to_string(repo().join("scripts/test.sh")).expect("test.sh");
    let pinned = test_sh
        .split_whitespace()
        .find_map(|w| w.strip_prefix("cargo-auditable@"))
        .expect("scripts/test.sh pins cargo-auditable@VERSION");
    assert!(
        lines.contains(&format!("ARG CARGO_AUDITABLE_VERSION={pinned}").as_str()),
        "the Containerfile's cargo-auditable is scripts/test.sh's {pinned}: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l
                .contains("cargo install --locked \"cargo-auditable@${CARGO_AUDITABLE_VERSION}\"")),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"&& DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends jq binutils \\"),
        "{lines:?}"
    );
    // The final stage: the script's output as the root, nothing else.
    let final_stage: Vec<&str> = lines
        .iter()
        .skip_while(|l| !l.starts_with(last))
        .copied()
        .collect();
    assert_eq!(
        final_stage,
        [
            *last,
            "ARG VERSION=unknown",
            "ARG REVISION=unknown",
            "COPY --from=build /image-content/ /",
            "LABEL org.opencontainers.image.source=\"https://github.com/credbroker/credbroker\" org.opencontainers.image.version=\"${VERSION}\" org.opencontainers.image.revision=\"${REVISION}\" org.opencontainers.image.title=\"credbroker\"",
            "USER 65532:65532",
            "WORKDIR /",
            "ENTRYPOINT [\"/bin/credbroker\"]",
            "CMD [\"serve\", \"--config\", \"/etc/credbroker/config.yaml\"]",
        ]
    );
    // One image for both shim deliveries: no installer stage, no busybox or other base.
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("shim-installer") || l.contains("busybox")),
        "init copy runs the credbroker image's own shim (`credbroker-shim install`): {lines:?}"
    );
    // Two stages, one way to build: the script in the build stage, its output on an empty
    // base (an image from content built beforehand is scripts/build-image.sh --content's).
    assert_eq!(
        stages,
        ["FROM ${RUST_IMAGE} AS build", "FROM scratch AS credbroker"],
        "{lines:?}"
    );
}

/// Where the Kueue exec command's path lands, for each delivery variant: follows the manager's
/// mount to an image volume (the image content plus subPath) or to an emptyDir filled by an
/// init container (its command run here as [`run_init_container`] says).
fn shim_as_the_manager_sees_it(objects: &[Value], delivery: Delivery, scratch: &Path) -> PathBuf {
    let pod = pod_spec(objects);
    let command = str_of(
        &kueue_access_providers(&kueue_config(objects))[0]["execConfig"]["command"],
        "command",
    )
    .to_owned();
    let (vol, at, sub_path) = mount_for(manager(pod), &command);
    let rest = command
        .strip_prefix(&format!("{at}/"))
        .expect("inside the mount");
    let v = volume(pod, &vol);
    let content = image_content();
    match delivery {
        Delivery::ImageVolume => {
            assert!(v["image"].is_object(), "an image volume: {v}");
            assert_eq!(
                v["image"]["reference"],
                sidecar(pod)["image"],
                "the image volume is the sidecar's image (one pull, one version)"
            );
            content.join(&sub_path).join(rest)
        }
        Delivery::InitCopy => {
            assert!(v["emptyDir"].is_object(), "an emptyDir: {v}");
            assert!(sub_path.is_empty());
            let installer = installer(pod, &vol);
            let emptydir = emptydir_for(scratch);
            let out = run_init_container(pod, installer, &vol, &emptydir);
            assert!(
                out.status.success(),
                "the init container: {}",
                describe(&out)
            );
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                said.starts_with("credbroker-shim: installed ") && out.stderr.is_empty(),
                "the init container's one line: {}",
                describe(&out)
            );
            // The pod restarts: the emptyDir keeps the last copy, the init container runs again.
            let out = run_init_container(pod, installer, &vol, &emptydir);
            assert!(
                out.status.success()
                    && String::from_utf8_lossy(&out.stdout)
                        .starts_with("credbroker-shim: replaced an earlier copy at "),
                "the init container, run again: {}",
                describe(&out)
            );
            emptydir.join(rest)
        }
    }
}

/// The init container of `pod` that fills volume `vol` (not the sidecar).
fn installer<'a>(pod: &'a Value, vol: &str) -> &'a Value {
    list(&pod["initContainers"], "initContainers")
        .iter()
        .find(|c| {
            c["restartPolicy"].is_null()
                && c["volumeMounts"]
                    .as_array()
                    .is_some_and(|ms| ms.iter().any(|m| m["name"] == vol))
        })
        .expect("an init container fills the emptyDir")
}

/// A directory standing for an emptyDir, as the kubelet makes one: mode 0777, owned by root,
/// reachable by uid 65532 (the tests' temp dirs are 0700).
fn emptydir_for(scratch: &Path) -> PathBuf {
    std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let dir = scratch.join("emptydir");
    std::fs::create_dir(&dir).expect("mkdir emptyDir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

/// Whether this process runs as root (`/proc/self` belongs to the effective uid).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").expect("/proc/self").uid() == 0
}

/// Runs `init`'s `command` + `args` as the rendered init container states them, on the host:
/// the executable is the image content's file at the command's path (the container runs the
/// sidecar's image; copied to `image/` beside `emptydir`, mode kept), each argument inside a
/// mount of `vol` is that path in `emptydir` (the mount's subPath directory created as the
/// kubelet creates it: with the volume's own mode), and the process runs as the container's
/// `runAsUser`/`runAsGroup` when the tests run as root. Any other absolute path in the
/// arguments fails the test: this stand-in knows only `vol`.
fn run_init_container(pod: &Value, init: &Value, vol: &str, emptydir: &Path) -> Output {
    use std::os::unix::process::CommandExt as _;
    assert_eq!(
        init["image"],
        sidecar(pod)["image"],
        "the init container runs the sidecar's image (one image for both deliveries): {init}"
    );
    let mut argv = strings(&init["command"], "init container command");
    if !init["args"].is_null() {
        argv.extend(strings(&init["args"], "init container args"));
    }
    let program = argv.remove(0);
    let mounts = list(&init["volumeMounts"], "volumeMounts");
    let inside = |path: &str, at: &str| path == at || path.starts_with(&format!("{at}/"));
    assert!(
        !mounts
            .iter()
            .any(|m| inside(&program, str_of(&m["mountPath"], "mountPath"))),
        "the init container's executable {program} comes from its image, not a volume"
    );
    // The image's file, copied beside the emptyDir so that the container's uid reaches it.
    let executable = emptydir
        .with_file_name("image")
        .join(program.trim_start_matches('/'));
    if !executable.exists() {
        let mut dir = executable.parent().expect("dir").to_path_buf();
        std::fs::create_dir_all(&dir).expect("mkdir");
        while dir != emptydir.parent().expect("scratch") {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            dir.pop();
        }
        credbroker_tests::copy_executable(
            &image_content().join(program.trim_start_matches('/')),
            &executable,
        );
    }
    let args: Vec<PathBuf> = argv
        .iter()
        .map(|arg| {
            if !arg.starts_with('/') {
                return PathBuf::from(arg);
            }
            let (name, at, sub_path) = mount_for(init, arg);
            assert_eq!(name, vol, "{arg} is in the volume the init container fills");
            let dir = emptydir.join(&sub_path);
            if !dir.exists() {
                std::fs::create_dir_all(&dir).expect("mkdir subPath");
                let mode = emptydir.metadata().expect("stat").permissions().mode() & 0o7777;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
                    .expect("chmod subPath");
            }
            let rest = arg[at.len()..].trim_start_matches('/');
            if rest.is_empty() { dir } else { dir.join(rest) }
        })
        .collect();
    let mut command = Command::new(&executable);
    command.args(&args).env_clear();
    if running_as_root() {
        let sc = &init["securityContext"];
        let id = |key: &str| {
            sc[key]
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or_else(|| panic!("init container securityContext.{key}: {sc}"))
        };
        command.uid(id("runAsUser")).gid(id("runAsGroup"));
    }
    run(&mut command, COMMAND_TIMEOUT)
}

/// Every image `pod` runs or mounts besides Kueue's manager image: (where, reference).
fn credbroker_images(pod: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for key in ["initContainers", "containers"] {
        for c in pod[key].as_array().into_iter().flatten() {
            if c["name"] != MANAGER {
                found.push((
                    format!("{key}[{}]", c["name"]),
                    str_of(&c["image"], "image").to_owned(),
                ));
            }
        }
    }
    for v in pod["volumes"].as_array().into_iter().flatten() {
        if let Some(reference) = v["image"]["reference"].as_str() {
            found.push((format!("volume {}", v["name"]), reference.to_owned()));
        }
    }
    found
}

/// Item 4 of issue 21: one image for both deliveries. Besides Kueue's own manager image, the
/// pod runs and mounts only the sidecar's image, whichever shim component is on.
#[test]
fn the_pod_runs_no_image_but_kueues_and_credbrokers() {
    for (dir, delivery, objects) in overlays() {
        let pod = pod_spec(&objects);
        let image = str_of(&sidecar(pod)["image"], "sidecar image");
        let images = credbroker_images(pod);
        assert!(images.len() >= 2, "{dir}: {images:?}");
        for (what, other) in &images {
            assert_eq!(other, image, "{dir} ({delivery:?}): {what}");
        }
    }
}

/// The init container's install, run as the rendered overlay states it, then the installed
/// shim: it is the image's shim, byte for byte and mode 0755, and gets a token from a broker.
#[test]
fn init_copy_installs_the_shim_as_the_overlay_runs_it() {
    let objects = render(OVERLAYS[1].0);
    let pod = pod_spec(&objects);
    let scratch = tempdir();
    let path = shim_as_the_manager_sees_it(&objects, Delivery::InitCopy, scratch.path());
    let shim = image_content().join("plugins/bin/credbroker-shim");
    assert_eq!(
        std::fs::read(&path).expect("the installed shim"),
        std::fs::read(&shim).expect("the image's shim")
    );
    assert_eq!(
        path.metadata().expect("stat").permissions().mode() & 0o7777,
        0o755
    );
    let installed_dir = path.parent().expect("dir");
    let names: Vec<_> = std::fs::read_dir(installed_dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["credbroker-shim"], "no temporary file left");

    let files = TokenFiles::new();
    files.write("c", "token-from-the-init-copy");
    let broker = Broker::start(&config_yaml(&[file_provider("static", &files.template())]));
    let info = exec_info(V1, "https://c.example", json!({"clusterName": "c"}));
    let out = run(
        Command::new(&path)
            .args(["--provider", "static", "--socket"])
            .arg(broker.socket())
            .env_clear()
            .env("KUBERNETES_EXEC_INFO", &info),
        COMMAND_TIMEOUT,
    );
    assert_eq!(
        assert_credential(&out, V1).token,
        "token-from-the-init-copy"
    );

    // What is not an earlier copy is refused, named, and left alone.
    let installer = installer(pod, "credbroker-plugins");
    let other = tempdir();
    let emptydir = emptydir_for(other.path());
    std::fs::create_dir(emptydir.join("bin")).expect("mkdir");
    std::fs::set_permissions(emptydir.join("bin"), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    let stranger = emptydir.join("bin/credbroker-shim");
    write_file(
        &emptydir,
        "bin/credbroker-shim",
        "#!/bin/sh\necho not the shim\n",
        0o755,
    );
    let out = run_init_container(pod, installer, "credbroker-plugins", &emptydir);
    assert_shim_error(
        &out,
        &[
            "refusing to replace",
            &stranger.display().to_string(),
            "not an earlier credbroker-shim",
        ],
    );
    assert_eq!(
        std::fs::read_to_string(&stranger).expect("left alone"),
        "#!/bin/sh\necho not the shim\n"
    );
}

/// docs/deploy.md section 2's block that runs the init container's command by hand: run as
/// written, with the image content's and the stand-in emptyDir's paths swapped for the test's.
#[test]
fn deploy_md_install_block_runs_as_written() {
    const CONTENT: &str = "target/image-content";
    const EMPTYDIR: &str = "/tmp/emptydir";
    let blocks = blocks_of(&repo(), "docs/deploy.md");
    let block = blocks
        .iter()
        .find(|b| b.kind.as_deref() == Some("manual") && b.body.contains("credbroker-shim install"))
        .expect("docs/deploy.md shows the install command in a `sh manual` block");
    // The block runs what the init container runs: its executable and arguments, DIR aside.
    let objects = render(OVERLAYS[1].0);
    let pod = pod_spec(&objects);
    let init = installer(pod, "credbroker-plugins");
    let command = strings(&init["command"], "command");
    let (program, verb) = (&command[0], &command[1]);
    assert!(
        block
            .body
            .contains(&format!("{CONTENT}{program} {verb} {EMPTYDIR}/bin")),
        "{}: the block runs the init container's {command:?} on {CONTENT}",
        block.at()
    );

    let tmp = tempdir();
    let script = block
        .body
        .replace(CONTENT, image_content().to_str().expect("UTF-8"))
        .replace(
            EMPTYDIR,
            tmp.path().join("emptydir").to_str().expect("UTF-8"),
        );
    let out = run(
        Command::new("sh").args(["-eu", "-c", &script]),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "{}: {}", block.at(), describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let installed = tmp.path().join("emptydir/bin/credbroker-shim");
    assert_eq!(
        lines,
        [
            format!(
                "credbroker-shim: installed {} ({} bytes)",
                installed.display(),
                installed.metadata().expect("installed").len()
            ),
            format!("credbroker-shim {}", env!("CARGO_PKG_VERSION")),
            format!(
                "credbroker-shim: replaced an earlier copy at {} ({} bytes)",
                installed.display(),
                installed.metadata().expect("installed").len()
            ),
        ],
        "{}: {}",
        block.at(),
        describe(&out)
    );
}

#[test]
fn kueue_exec_command_finds_the_shim_in_both_delivery_variants() {
    let shim_bytes =
        std::fs::read(image_content().join("plugins/bin/credbroker-shim")).expect("read shim");
    for (dir, delivery, objects) in overlays() {
        let scratch = tempdir();
        let path = shim_as_the_manager_sees_it(&objects, delivery, scratch.path());
        let meta = path.metadata().unwrap_or_else(|e| {
            panic!(
                "{dir}: the Kueue command resolves to {}, which is missing: {e}",
                path.display()
            )
        });
        assert!(
            meta.is_file() && meta.permissions().mode() & 0o111 != 0,
            "{dir}: {} is not executable",
            path.display()
        );
        assert!(
            std::fs::read(&path).expect("read") == shim_bytes,
            "{dir}: {} is not the shim",
            path.display()
        );
    }
}

// ---------------------------------------------------------------------------------------
// End to end in an empty root
// ---------------------------------------------------------------------------------------

fn write_file(root: &Path, path: &str, contents: &str, mode: u32) {
    let file = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
    std::fs::write(&file, contents).expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// KUBERNETES_EXEC_INFO as client-go builds it from a ClusterProfile access provider (via
/// cluster-inventory-api's BuildConfigFromCP): server, CA data, and the exec extension as
/// spec.cluster.config.
fn exec_info_for(exec: &Value, cluster: &Value) -> String {
    json!({
        "apiVersion": exec["apiVersion"],
        "kind": "ExecCredential",
        "spec": {
            "interactive": false,
            "cluster": {
                "server": cluster["server"],
                "certificate-authority-data": cluster["certificate-authority-data"],
                "config": exec_extension(cluster),
            },
        },
    })
    .to_string()
}

#[test]
fn rendered_config_serves_probe_and_example_cluster_in_an_empty_root() {
    let objects = render(OVERLAYS[0].0);
    let pod = pod_spec(&objects);
    let side = sidecar(pod);
    let broker = broker_config(&objects);
    let kueue = kueue_config(&objects);

    // The sidecar's filesystem: image content, the config ConfigMap at its mount, an empty
    // socket directory (emptyDir: world-writable), the on-prem token Secret.
    let root = image_root();
    let args = strings(&side["args"], "sidecar args");
    let config_path = &args[args.iter().position(|a| a == "--config").expect("--config") + 1];
    let (config_vol, config_at, _) = mount_for(side, config_path);
    let cm_name = str_of(
        &volume(pod, &config_vol)["configMap"]["name"],
        "configMap.name",
    );
    let cm = find(&objects, "ConfigMap", cm_name);
    for (key, value) in cm["data"].as_object().expect("ConfigMap data") {
        write_file(
            root.path(),
            &format!("{config_at}/{key}"),
            str_of(value, key),
            0o644,
        );
    }
    let socket = str_of(&broker["socket"]["path"], "socket.path");
    let socket_dir = root.path().join(
        Path::new(socket)
            .parent()
            .expect("dir")
            .strip_prefix("/")
            .expect("abs"),
    );
    std::fs::create_dir_all(&socket_dir).expect("mkdir socket dir");
    std::fs::set_permissions(&socket_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");

    let examples = render(EXAMPLE_CLUSTERS);
    let onprem = all(&examples, "ClusterProfile")
        .into_iter()
        .find(|cp| cp["status"]["accessProviders"][0]["name"] == "onprem")
        .expect("an on-prem example");
    let cluster = &onprem["status"]["accessProviders"][0]["cluster"];
    let entry = kueue_access_providers(&kueue)
        .into_iter()
        .find(|e| e["name"] == "onprem")
        .expect("Kueue entry onprem");
    let exec = &entry["execConfig"];
    let provider = broker_provider(&broker, &shim_provider(exec)).clone();
    let cluster_name = str_of(&exec_extension(cluster)["clusterName"], "clusterName").to_owned();
    let token_path =
        str_of(&provider["file"]["path"], "file.path").replace("{clusterName}", &cluster_name);
    write_file(
        root.path(),
        &token_path,
        "onprem-token-from-the-secret\n",
        0o644,
    );

    // The broker, as the sidecar runs it: its args, its uid.
    let uid = u32::try_from(
        side["securityContext"]["runAsUser"]
            .as_u64()
            .expect("runAsUser"),
    )
    .expect("uid");
    let mut argv = vec!["/bin/credbroker"];
    argv.extend(args.iter().map(String::as_str));
    let mut broker_proc = Running::spawn(&mut chroot_command(root.path(), Some(uid), &argv));
    let host_socket = root.path().join(socket.trim_start_matches('/'));
    let listening = wait_until(BROKER_TIMEOUT, || UnixStream::connect(&host_socket).is_ok());
    if !listening {
        let out = broker_proc.wait_timeout(Duration::from_secs(1));
        panic!("the broker in the chroot never listened on {socket}: {out:?}");
    }

    // A cluster whose token is missing: GetToken fails, and the probes must not care (a
    // credential problem never restarts the sidecar nor touches the pod's readiness).
    let mut argv = vec![str_of(&exec["command"], "command")];
    let exec_args = strings(&exec["args"], "args");
    argv.extend(exec_args.iter().map(String::as_str));
    let mut missing = cluster.clone();
    missing["extensions"] = json!([{
        "name": EXEC_EXTENSION,
        "extension": {"clusterName": "no-such-cluster"},
    }]);
    let out = chroot(
        root.path(),
        Some(NONROOT),
        &argv,
        &[("KUBERNETES_EXEC_INFO", &exec_info_for(exec, &missing))],
    );
    assert_shim_error(&out, &["no-such-cluster"]);

    // The sidecar's probes, as the kubelet runs them (inside the sidecar, as its uid).
    for probe in SIDECAR_PROBES {
        let command = strings(&side[probe]["exec"]["command"], probe);
        let argv: Vec<&str> = command.iter().map(String::as_str).collect();
        let out = chroot(root.path(), Some(uid), &argv, &[]);
        assert!(
            out.status.success(),
            "{probe} fails against a serving broker: {}",
            describe(&out)
        );
    }

    // Kueue's exec entry, as client-go runs it for the on-prem example (as the manager's uid).
    let info = exec_info_for(exec, cluster);
    let out = chroot(
        root.path(),
        Some(NONROOT),
        &argv,
        &[("KUBERNETES_EXEC_INFO", &info)],
    );
    let cred = assert_credential(&out, V1);
    assert_eq!(cred.token, "onprem-token-from-the-secret");

    // Other users in the pod: another uid and group cannot even open the socket (mode 0660);
    // another uid in the socket's group is refused by socket.allowedUids.
    let out = chroot_as(
        root.path(),
        "1000:1000",
        &argv,
        &[("KUBERNETES_EXEC_INFO", &info)],
    );
    assert_shim_error(&out, &["cannot connect to the broker", "Permission denied"]);
    let in_group = format!("1000:{NONROOT}");
    let out = chroot_as(
        root.path(),
        &in_group,
        &argv,
        &[("KUBERNETES_EXEC_INFO", &info)],
    );
    assert_shim_error(&out, &["PERMISSION_DENIED", "1000"]);

    // A stopped broker fails the probe: the kubelet would restart the sidecar.
    send_signal(broker_proc.id(), "TERM");
    let out = broker_proc.wait(BROKER_TIMEOUT);
    assert!(
        out.status.success(),
        "broker exit after SIGTERM: {}",
        describe(&out)
    );
    let command = strings(&side["livenessProbe"]["exec"]["command"], "livenessProbe");
    let argv: Vec<&str> = command.iter().map(String::as_str).collect();
    let out = chroot(root.path(), Some(uid), &argv, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{}",
        describe(&out)
    );
}

// ---------------------------------------------------------------------------------------
// The optional metrics component, its alerts, the NetworkPolicy example
// ---------------------------------------------------------------------------------------

/// An overlay with the metrics component (the image-volume overlay plus the component).
const METRICS_EXAMPLE: &str = "deploy/examples/metrics";
/// The metrics example's own broker config (a component of the example's, listed last).
const METRICS_EXAMPLE_CONFIG: &str = "deploy/examples/metrics/credbroker-config/credbroker.yaml";
const NETWORK_POLICY_EXAMPLE: &str = "deploy/examples/network-policy";

/// Whether every `key: value` of `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let sel = selector.as_object().expect("matchLabels map");
    !sel.is_empty() && sel.iter().all(|(k, v)| labels[k] == *v)
}

#[test]
fn metrics_component_exposes_the_port_the_config_listens_on() {
    // Metrics stay off in the shipped overlays.
    for (dir, _, objects) in overlays() {
        assert!(
            broker_config(&objects)["metrics"].is_null(),
            "{dir}: metrics are opt-in (the component)"
        );
    }
    let base = broker_config(&render(OVERLAYS[0].0));
    let objects = render(METRICS_EXAMPLE);
    let deployment = find(&objects, "Deployment", DEPLOYMENT);
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let pod = pod_spec(&objects);
    let side = sidecar(pod);

    // The config: the base config plus metrics.address on all addresses, one ConfigMap.
    let broker = broker_config(&objects);
    let address = str_of(&broker["metrics"]["address"], "metrics.address");
    let (host, port) = address.rsplit_once(':').expect("HOST:PORT");
    assert_eq!(host, "0.0.0.0", "scraped on the pod IP: {address}");
    let port: u64 = port.parse().expect("a port number");
    let mut without_metrics = broker.clone();
    without_metrics
        .as_object_mut()
        .expect("config map")
        .remove("metrics");
    assert_eq!(
        without_metrics, base,
        "{METRICS_EXAMPLE_CONFIG} must be the sidecar component's credbroker.yaml plus `metrics`"
    );
    let configs: Vec<_> = all(&objects, "ConfigMap")
        .into_iter()
        .filter(|c| str_of(&c["metadata"]["name"], "name").starts_with("credbroker-config"))
        .collect();
    assert_eq!(
        configs.len(),
        1,
        "the example's config replaces the sidecar's"
    );
    let tmp = tempdir();
    let file = tmp.path().join("config.yaml");
    std::fs::write(&file, broker_config_text(&objects)).expect("write config");
    let out = run_broker_cli(&["check-config".as_ref(), file.as_os_str()]);
    assert!(out.status.success(), "check-config: {}", describe(&out));

    // The sidecar declares that port; the Service and the PodMonitor reach it.
    let ports = list(&side["ports"], "sidecar ports");
    let declared = ports
        .iter()
        .find(|p| p["containerPort"].as_u64() == Some(port))
        .unwrap_or_else(|| panic!("the sidecar declares no containerPort {port}: {ports:?}"));
    let port_name = str_of(&declared["name"], "port name");
    let service = all(&objects, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == "credbroker-metrics")
        .expect("Service credbroker-metrics");
    assert_eq!(service["metadata"]["namespace"], NAMESPACE);
    assert!(
        selects(&service["spec"]["selector"], pod_labels),
        "the Service selects Kueue's manager pods: {} vs {pod_labels}",
        service["spec"]["selector"]
    );
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"].as_u64(),
        Some(port),
        "{service}"
    );
    let monitor = find(&objects, "PodMonitor", "credbroker");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["namespace"], NAMESPACE);
    assert!(
        selects(&monitor["spec"]["selector"]["matchLabels"], pod_labels),
        "the PodMonitor selects Kueue's manager pods: {monitor}"
    );
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], port_name, "{monitor}");
    assert_eq!(endpoint["path"], "/metrics", "{monitor}");
    let rule = find(&objects, "PrometheusRule", "credbroker");
    assert_eq!(rule["metadata"]["namespace"], NAMESPACE);

    // Over Kueue's real manifests, the PodMonitor reaches the broker and nothing else.
    for version in KUEUE_VERSIONS {
        let objects = render_over(METRICS_EXAMPLE, version);
        let monitor = find(&objects, "PodMonitor", "credbroker");
        let targets = pod_monitor_targets(pod_spec(&objects), monitor);
        assert_eq!(
            targets,
            [(SIDECAR.to_owned(), port)],
            "over Kueue {version}, the PodMonitor must scrape the broker's port only \
             (Kueue's manager serves HTTPS metrics on a port named `metrics`)"
        );
    }
}

/// The (container, port) pairs a PodMonitor's endpoints scrape in `pod`, as Prometheus'
/// pod discovery makes them: one target per declared container port (init containers
/// included) whose name is the endpoint's `port`, kept or dropped by `keep` relabelings on
/// the container name.
fn pod_monitor_targets(pod: &Value, monitor: &Value) -> Vec<(String, u64)> {
    let mut targets = Vec::new();
    for endpoint in list(
        &monitor["spec"]["podMetricsEndpoints"],
        "podMetricsEndpoints",
    ) {
        let want = str_of(&endpoint["port"], "podMetricsEndpoints[].port");
        for kind in ["initContainers", "containers"] {
            for c in pod[kind].as_array().into_iter().flatten() {
                let container = str_of(&c["name"], "container name");
                let kept = endpoint["relabelings"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|r| r["action"] == "keep")
                    .all(|r| {
                        assert_eq!(
                            strings(&r["sourceLabels"], "sourceLabels"),
                            ["__meta_kubernetes_pod_container_name"],
                            "a keep relabeling this check does not model: {r}"
                        );
                        r["regex"] == container
                    });
                for p in c["ports"].as_array().into_iter().flatten() {
                    if p["name"] == want && kept {
                        let number = p["containerPort"].as_u64().expect("containerPort");
                        targets.push((container.to_owned(), number));
                    }
                }
            }
        }
    }
    targets
}

#[test]
fn pod_monitor_targets_model_the_port_name_collision() {
    let pod = json!({
        "initContainers": [{"name": "credbroker", "ports": [{"name": "metrics", "containerPort": 9090}]}],
        "containers": [{"name": "manager", "ports": [{"name": "metrics", "containerPort": 8443}]}],
    });
    let by_name = json!({"spec": {"podMetricsEndpoints": [{"port": "metrics"}]}});
    assert_eq!(
        pod_monitor_targets(&pod, &by_name),
        [
            ("credbroker".to_owned(), 9090),
            ("manager".to_owned(), 8443)
        ],
        "issue 23.1: a shared port name scrapes Kueue's HTTPS port too"
    );
    let kept = json!({"spec": {"podMetricsEndpoints": [{"port": "metrics", "relabelings": [
        {"sourceLabels": ["__meta_kubernetes_pod_container_name"], "regex": "credbroker", "action": "keep"}
    ]}]}});
    assert_eq!(
        pod_monitor_targets(&pod, &kept),
        [("credbroker".to_owned(), 9090)]
    );
}

/// `credbroker_*` metric names and `label="value"` / `label!="value"` matchers in a PromQL
/// expression.
fn promql_references(expr: &str) -> (BTreeSet<String>, Vec<(String, String)>) {
    let mut names = BTreeSet::new();
    let mut matchers = Vec::new();
    let bytes = expr.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if !word(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && word(bytes[i]) {
            i += 1;
        }
        let ident = &expr[start..i];
        if ident.starts_with("credbroker_") {
            names.insert(ident.to_owned());
        }
        let rest = &expr[i..];
        let value = rest
            .strip_prefix("=\"")
            .or_else(|| rest.strip_prefix("!=\""))
            .and_then(|r| r.split_once('"'))
            .map(|(v, _)| v);
        if let Some(v) = value {
            matchers.push((ident.to_owned(), v.to_owned()));
        }
    }
    (names, matchers)
}

#[test]
fn promql_references_finds_metrics_and_matchers() {
    let (names, matchers) = promql_references(
        r#"sum by (provider) (rate(credbroker_requests_total{code!="OK",provider="x"}[5m])) / credbroker_cache_entries"#,
    );
    assert_eq!(
        names,
        ["credbroker_cache_entries", "credbroker_requests_total"]
            .map(str::to_owned)
            .into()
    );
    assert_eq!(
        matchers,
        [("code", "OK"), ("provider", "x")].map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
}

/// Every alert reads metrics a running broker exports, with label values it really uses.
#[test]
fn alerts_use_metrics_and_label_values_the_broker_exports() {
    use credbroker_tests::{Broker, TokenFiles, config_yaml, file_provider, run_shim};
    let tokens = TokenFiles::new();
    tokens.write("lab-1", "a-token");
    // A tiny rate limit, so that a burst of calls meets it.
    let config = config_yaml(&[file_provider("onprem", &tokens.template())])
        + "metrics: {address: \"127.0.0.1:0\"}\nrateLimit: {perSecond: 1, burst: 2}\n";
    let broker = Broker::start(&config);
    let address = broker.metrics_address();
    // One call that works and one whose upstream fails: both outcomes and codes appear.
    let info = |cluster: &str| {
        credbroker_tests::exec_info(
            V1,
            "https://k8s.example:6443",
            json!({"clusterName": cluster}),
        )
    };
    let out = run_shim(
        broker.socket(),
        &["--provider", "onprem"],
        Some(&info("lab-1")),
    );
    assert_credential(&out, V1);
    let out = run_shim(
        broker.socket(),
        &["--provider", "onprem"],
        Some(&info("gone")),
    );
    assert_shim_error(&out, &["gone"]);
    let limited = (0..10).any(|_| {
        let out = run_shim(
            broker.socket(),
            &["--provider", "onprem"],
            Some(&info("lab-1")),
        );
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("RESOURCE_EXHAUSTED")
    });
    assert!(limited, "no call met rateLimit {{perSecond: 1, burst: 2}}");
    let exposition = credbroker_tests::scrape_metrics(&address);
    // Sample names from the families' TYPE lines (a counter family without samples yet still
    // declares its name).
    let mut exported = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_count", "_sum"],
            _ => &[""],
        };
        for s in suffixes {
            exported.insert(format!("{name}{s}"));
        }
    }
    // Families without samples yet (stale serving, refresh failures need hours of token
    // lifetime to happen) print nothing: those names are checked against what
    // broker/src/engine/metrics.rs registers, with the suffixes the exposition adds.
    let source =
        std::fs::read_to_string(repo().join("broker/src/engine/metrics.rs")).expect("metrics.rs");
    let registered: BTreeSet<String> = source
        .split("registry.register(")
        .skip(1)
        .filter_map(|rest| Some(rest.split('"').nth(1)?.to_owned()))
        .collect();
    assert!(registered.contains("requests"), "{registered:?}");
    let is_registered = |name: &str| {
        let Some(base) = name.strip_prefix("credbroker_") else {
            return false;
        };
        ["_total", "_count", "_sum", "_bucket", ""]
            .iter()
            .any(|s| base.strip_suffix(s).is_some_and(|b| registered.contains(b)))
    };
    let code_names: BTreeSet<&str> = (0..17)
        .map(|c| credbroker_proto::code_name(tonic::Code::from_i32(c)))
        .collect();

    let rule = find(&render(METRICS_EXAMPLE), "PrometheusRule", "credbroker").clone();
    let mut used = BTreeSet::new();
    let mut alerts = 0;
    for group in list(&rule["spec"]["groups"], "groups") {
        for r in list(&group["rules"], "rules") {
            let alert = str_of(&r["alert"], "alert");
            let expr = str_of(&r["expr"], "expr");
            alerts += 1;
            assert!(
                r["labels"]["severity"].is_string() && r["annotations"]["summary"].is_string(),
                "{alert}: severity and summary"
            );
            let (names, matchers) = promql_references(expr);
            assert!(!names.is_empty(), "{alert} reads no credbroker metric");
            for name in &names {
                assert!(
                    exported.contains(name) || is_registered(name),
                    "{alert}: {name} is neither in the broker's /metrics ({exported:?}) nor registered in broker/src/engine/metrics.rs ({registered:?})"
                );
            }
            for (label, value) in matchers {
                match label.as_str() {
                    "code" => assert!(
                        code_names.contains(value.as_str()),
                        "{alert}: code=\"{value}\" is not a gRPC code name the broker uses"
                    ),
                    "outcome" => assert!(
                        exposition.contains(&format!("outcome=\"{value}\"")),
                        "{alert}: outcome=\"{value}\" never appears in /metrics"
                    ),
                    // Answer::label in broker/src/engine/review.rs names the four values.
                    "answer" => assert!(
                        std::fs::read_to_string(repo().join("broker/src/engine/review.rs"))
                            .expect("review.rs")
                            .contains(&format!("=> \"{value}\",")),
                        "{alert}: answer=\"{value}\" is not an answer Answer::label gives"
                    ),
                    other => panic!("{alert}: no check for label {other}"),
                }
            }
            used.extend(names);
        }
    }
    assert!(alerts >= 4, "{rule}");
    // A refused call is counted: the rate-limit alert has something to read.
    assert!(
        exposition
            .lines()
            .any(|l| l.starts_with("credbroker_rate_limited_total ") && !l.ends_with(" 0")),
        "rate-limited calls are not counted:\n{exposition}"
    );
    // The alerts that matter: upstream failures, stale serving, refreshes failing near expiry,
    // failing GetToken calls, rate-limited callers.
    for needed in [
        "credbroker_rate_limited_total",
        "credbroker_upstream_fetch_duration_seconds_count",
        "credbroker_cache_stale_served_total",
        "credbroker_refresh_failures_total",
        "credbroker_requests_total",
    ] {
        assert!(used.contains(needed), "no alert reads {needed}: {used:?}");
    }
}

#[test]
fn network_policy_example_opens_what_the_providers_call() {
    let policy = render(NETWORK_POLICY_EXAMPLE);
    let overlay = render(OVERLAYS[0].0);
    let pod_labels =
        &find(&overlay, "Deployment", DEPLOYMENT)["spec"]["template"]["metadata"]["labels"];
    let nps = all(&policy, "NetworkPolicy");
    assert_eq!(nps.len(), 1);
    let np = nps[0];
    assert_eq!(np["metadata"]["namespace"], NAMESPACE);
    assert!(
        selects(&np["spec"]["podSelector"]["matchLabels"], pod_labels),
        "selects Kueue's manager pod: {np}"
    );
    assert_eq!(np["spec"]["policyTypes"], json!(["Egress"]));
    // (cidr or "peer", port, protocol) reachable.
    let mut open = BTreeSet::new();
    for rule in list(&np["spec"]["egress"], "egress") {
        for to in list(&rule["to"], "to") {
            let peer = to["ipBlock"]["cidr"]
                .as_str()
                .unwrap_or("selector")
                .to_owned();
            for p in list(&rule["ports"], "ports") {
                open.insert((
                    peer.clone(),
                    p["port"].as_u64().expect("numeric port"),
                    str_of(&p["protocol"], "protocol").to_owned(),
                ));
            }
        }
    }
    for want in [
        ("selector", 53, "UDP"),           // DNS
        ("0.0.0.0/0", 443, "TCP"),         // STS, Entra ID, Google, workers
        ("::/0", 443, "TCP"),              // the same in IPv6 clusters
        ("169.254.169.254/32", 80, "TCP"), // AWS/Azure IMDS, GCE metadata
        ("169.254.170.23/32", 80, "TCP"),  // EKS Pod Identity agent
    ] {
        let want = (want.0.to_owned(), want.1, want.2.to_owned());
        assert!(open.contains(&want), "{want:?} not open: {open:?}");
    }

    // Every address the example's comments and docs/deploy.md, section 10, name has a rule:
    // a comment naming an address with no rule for it was how the IPv6 Pod Identity agent
    // ([fd00:ec2::23]:80) went missing.
    let comments = std::fs::read_to_string(
        repo()
            .join(NETWORK_POLICY_EXAMPLE)
            .join("networkpolicy.yaml"),
    )
    .expect("read the example");
    let doc = std::fs::read_to_string(repo().join("docs/deploy.md")).expect("deploy.md");
    let section10 = &doc[doc.find("## 10. ").expect("section 10")..];
    let section10 = &section10[..section10.find("\n## ").unwrap_or(section10.len())];
    let named: Vec<(std::net::IpAddr, u16)> = named_addresses(&comments)
        .into_iter()
        .chain(named_addresses(section10))
        .collect();
    assert!(named.len() >= 4, "addresses named: {named:?}");
    for (ip, port) in named {
        let covered = open.iter().any(|(cidr, p, proto)| {
            *p == u64::from(port) && proto == "TCP" && cidr_contains(cidr, ip)
        });
        assert!(
            covered,
            "{ip} port {port} is named but no egress rule opens it: {open:?}"
        );
    }
}

/// `A.B.C.D:PORT` and `[V6]:PORT` in a text.
fn named_addresses(text: &str) -> Vec<(std::net::IpAddr, u16)> {
    let mut found = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || "`(),;".contains(c)) {
        let (host, port) = match word.rsplit_once(':') {
            Some((h, p)) if !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) => (h, p),
            _ => continue,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let (Ok(ip), Ok(port)) = (host.parse::<std::net::IpAddr>(), port.parse::<u16>()) {
            found.push((ip, port));
        }
    }
    found
}

/// Whether `cidr` (`ADDR/BITS`; "selector" for a namespace peer) holds `ip`.
fn cidr_contains(cidr: &str, ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    let Some((net, bits)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(bits)) = (net.parse::<IpAddr>(), bits.parse::<u32>()) else {
        return false;
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

#[test]
fn named_addresses_and_cidrs_are_read_as_written() {
    let found =
        named_addresses("agent (169.254.170.23:80; IPv6: `[fd00:ec2::23]:80`), https://x:443");
    assert_eq!(
        found,
        [
            ("169.254.170.23".parse().unwrap(), 80),
            ("fd00:ec2::23".parse().unwrap(), 80)
        ]
    );
    assert!(cidr_contains(
        "fd00:ec2::23/128",
        "fd00:ec2::23".parse().unwrap()
    ));
    assert!(!cidr_contains(
        "169.254.170.23/32",
        "fd00:ec2::23".parse().unwrap()
    ));
    assert!(cidr_contains(
        "0.0.0.0/0",
        "169.254.170.23".parse().unwrap()
    ));
    assert!(!cidr_contains("selector", "10.0.0.1".parse().unwrap()));
}

// ---------------------------------------------------------------------------------------
// Kueue's integrations and what MultiKueue does on a worker
// ---------------------------------------------------------------------------------------

/// One request MultiKueue makes to a worker's API server: (API group, resource, verb).
type Request = (String, String, String);

/// Per integration Kueue has a MultiKueue adapter for: (framework name, API group, resource,
/// verbs on a worker), from `pkg/controller/jobs/*/*_multikueue_adapter.go` of Kueue v0.19.2
/// and v0.17.0. `watch`: the watch `multikueuecluster.go` opens on every worker for each enabled
/// adapter (one failing refuses the worker); `get`, `create`, `delete`: SyncJob,
/// DeleteRemoteObject and `jobframework.ValidateRemoteObjectOwnership`; `patch`: the elastic
/// resize (batch/job, ray) and the ray adapters' spec sync; `list`: v0.17.0's Pod groups.
/// docs/deploy.md, "Integrations on workers", shows the same table.
const FRAMEWORKS: [(&str, &str, &str, &[&str]); 17] = [
    (
        "batch/job",
        "batch",
        "jobs",
        &["get", "watch", "create", "delete", "patch"],
    ),
    (
        "kubeflow.org/mpijob",
        "kubeflow.org",
        "mpijobs",
        &["get", "watch", "create", "delete"],
    ),
    (
        "kubeflow.org/pytorchjob",
        "kubeflow.org",
        "pytorchjobs",
        &["get", "watch", "create", "delete"],
    ),
    (
        "kubeflow.org/tfjob",
        "kubeflow.org",
        "tfjobs",
        &["get", "watch", "create", "delete"],
    ),
    (
        "kubeflow.org/paddlejob",
        "kubeflow.org",
        "paddlejobs",
        &["get", "watch", "create", "delete"],
    ),
    (
        "kubeflow.org/xgboostjob",
        "kubeflow.org",
        "xgboostjobs",
        &["get", "watch", "create", "delete"],
    ),
    (
        "kubeflow.org/jaxjob",
        "kubeflow.org",
        "jaxjobs",
        &["get", "watch", "create", "delete"],
    ),
    (
        "ray.io/rayjob",
        "ray.io",
        "rayjobs",
        &["get", "watch", "create", "delete", "patch"],
    ),
    (
        "ray.io/raycluster",
        "ray.io",
        "rayclusters",
        &["get", "watch", "create", "delete", "patch"],
    ),
    (
        "ray.io/rayservice",
        "ray.io",
        "rayservices",
        &["get", "watch", "create", "delete", "patch"],
    ),
    (
        "jobset.x-k8s.io/jobset",
        "jobset.x-k8s.io",
        "jobsets",
        &["get", "watch", "create", "delete"],
    ),
    (
        "workload.codeflare.dev/appwrapper",
        "workload.codeflare.dev",
        "appwrappers",
        &["get", "watch", "create", "delete"],
    ),
    (
        "trainer.kubeflow.org/trainjob",
        "trainer.kubeflow.org",
        "trainjobs",
        &["get", "watch", "create", "delete"],
    ),
    (
        "leaderworkerset.x-k8s.io/leaderworkerset",
        "leaderworkerset.x-k8s.io",
        "leaderworkersets",
        &["get", "watch", "create", "delete"],
    ),
    (
        "pod",
        "",
        "pods",
        &["get", "list", "watch", "create", "delete"],
    ),
    (
        "statefulset",
        "apps",
        "statefulsets",
        &["get", "watch", "create", "delete"],
    ),
    // No MultiKueue adapter: nothing on a worker (its Pods are the `pod` integration's).
    ("deployment", "", "", &[]),
];

/// What MultiKueue does to a worker's Workloads whatever the integrations: the watch on every
/// worker, garbage collection's list (runGC), the workload reconciler's get, create, update
/// (finalizer removal, priority) and delete, and the deactivation target it patches into the
/// status (PatchAdmissionStatus: server-side apply, or a merge patch).
const WORKLOAD_REQUESTS: [(&str, &str, &[&str]); 2] = [
    (
        "kueue.x-k8s.io",
        "workloads",
        &["get", "list", "watch", "create", "update", "delete"],
    ),
    ("kueue.x-k8s.io", "workloads/status", &["patch"]),
];

/// Requests only an alpha feature gate (off by default) makes: (gate, group, resource, verbs).
const GATED_REQUESTS: [(&str, &str, &str, &[&str]); 3] = [
    (
        "MultiKueueOrchestratedPreemption",
        "kueue.x-k8s.io",
        "workloads/status",
        &["update"],
    ),
    (
        "MultiKueueManagerQuotaAutomation",
        "kueue.x-k8s.io",
        "clusterqueues",
        &["list", "watch"],
    ),
    (
        "MultiKueueManagerQuotaAutomation",
        "kueue.x-k8s.io",
        "localqueues",
        &["list", "watch"],
    ),
];

fn requests(group: &str, resource: &str, verbs: &[&str]) -> BTreeSet<Request> {
    verbs
        .iter()
        .map(|v| (group.to_owned(), resource.to_owned(), (*v).to_owned()))
        .collect()
}

/// The requests MultiKueue makes on a worker under a Kueue configuration: the Workloads', each
/// enabled integration's, and those of the gates it turns on. An integration missing from
/// [`FRAMEWORKS`] fails, naming it.
fn worker_requests(kueue: &Value, what: &str) -> BTreeSet<Request> {
    let mut want = BTreeSet::new();
    for (group, resource, verbs) in WORKLOAD_REQUESTS {
        want.extend(requests(group, resource, verbs));
    }
    for framework in strings(
        &kueue["integrations"]["frameworks"],
        "integrations.frameworks",
    ) {
        let (_, group, resource, verbs) = FRAMEWORKS
            .iter()
            .find(|f| f.0 == framework)
            .unwrap_or_else(|| panic!("{what}: integration {framework:?} is not in FRAMEWORKS"));
        want.extend(requests(group, resource, verbs));
    }
    for (gate, group, resource, verbs) in GATED_REQUESTS {
        if kueue["featureGates"][gate] == true {
            want.extend(requests(group, resource, verbs));
        }
    }
    want
}

/// What a ClusterRole's rules allow, expanded; a wildcard or a resourceName-restricted rule
/// fails (neither can state "exactly these requests").
fn granted(role: &Value) -> BTreeSet<Request> {
    let mut have = BTreeSet::new();
    for rule in list(&role["rules"], "rules") {
        assert!(
            rule["resourceNames"].is_null() && rule["nonResourceURLs"].is_null(),
            "{rule}"
        );
        for group in strings(&rule["apiGroups"], "apiGroups") {
            for resource in strings(&rule["resources"], "resources") {
                for verb in strings(&rule["verbs"], "verbs") {
                    assert!(
                        ![&group, &resource, &verb].iter().any(|x| x.contains('*')),
                        "no wildcards in the worker role: {rule}"
                    );
                    have.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    have
}

/// The rendered Kueue configurations a worker may face: both overlays' over every Kueue
/// version, and the older component's, as the test of section 3 renders it.
fn kueue_configs_shipped() -> Vec<(String, Value)> {
    let mut configs: Vec<(String, Value)> = overlays()
        .into_iter()
        .map(|(dir, _, objects)| (dir, kueue_config(&objects)))
        .collect();
    for (dir, _) in KUEUE_CONFIG_COMPONENTS {
        let file = format!("{dir}/{KUEUE_CONFIG_KEY}");
        let text = std::fs::read_to_string(repo().join(&file)).expect("read the component");
        configs.push((file.clone(), parse_yaml(&text, &file)));
    }
    configs
}

/// Defect: with Kueue's default `integrations.frameworks`, MultiKueue watched a dozen kinds on
/// every worker and refused any worker lacking one CRD or its RBAC, and the worker RBAC deploy.md
/// named covered Jobs, JobSets and Workloads only. The shipped worker role must grant every
/// request MultiKueue makes for what the shipped Kueue configuration enables, and nothing more.
#[test]
fn worker_rbac_grants_exactly_what_multikueue_does_on_a_worker() {
    let objects = render(WORKER_RBAC);
    let role = find(&objects, "ClusterRole", WORKER_RBAC_NAME);
    let have = granted(role);
    for (what, kueue) in kueue_configs_shipped() {
        let want = worker_requests(&kueue, &what);
        // The watches first: one missing keeps the worker from ever turning Active.
        let watches: Vec<_> = want.iter().filter(|r| r.2 == "watch").collect();
        for w in &watches {
            assert!(
                have.contains(*w),
                "{what}: MultiKueue opens a watch on {}.{} on every worker, which {WORKER_RBAC} \
                 does not grant: the worker never turns Active",
                w.1,
                w.0
            );
        }
        let missing: Vec<_> = want.difference(&have).collect();
        let extra: Vec<_> = have.difference(&want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{what}: {WORKER_RBAC}'s ClusterRole must grant exactly MultiKueue's requests on a \
             worker; missing {missing:?}, beyond them {extra:?}"
        );
    }

    // The on-prem identity: a ServiceAccount in kueue-system, bound to that role.
    let sa = find(&objects, "ServiceAccount", WORKER_RBAC_NAME);
    assert_eq!(sa["metadata"]["namespace"], NAMESPACE);
    let binding = find(&objects, "ClusterRoleBinding", WORKER_RBAC_NAME);
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": WORKER_RBAC_NAME})
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": WORKER_RBAC_NAME, "namespace": NAMESPACE}])
    );
    assert_eq!(objects.len(), 3, "{WORKER_RBAC}: role, account, binding");
}

/// The checks above bite: Kueue's default frameworks need rules the worker role lacks, a
/// gate turned on adds its requests, and an unknown integration is named.
#[test]
fn worker_requests_follow_the_frameworks_and_gates() {
    let role = &render(WORKER_RBAC)[..];
    let have = granted(find(role, "ClusterRole", WORKER_RBAC_NAME));
    let defaults = json!({"integrations": {"frameworks": [
        "batch/job", "kubeflow.org/mpijob", "ray.io/rayjob", "ray.io/raycluster",
        "ray.io/rayservice", "jobset.x-k8s.io/jobset", "workload.codeflare.dev/appwrapper",
        "trainer.kubeflow.org/trainjob", "pod", "deployment", "statefulset",
        "leaderworkerset.x-k8s.io/leaderworkerset"]}});
    let want = worker_requests(&defaults, "Kueue v0.19.2's defaults");
    assert!(want.contains(&(
        "leaderworkerset.x-k8s.io".into(),
        "leaderworkersets".into(),
        "watch".into()
    )));
    assert!(
        !want.is_subset(&have),
        "the default frameworks need more than the role"
    );
    let gated = json!({"integrations": {"frameworks": ["batch/job"]},
                       "featureGates": {"MultiKueueManagerQuotaAutomation": true}});
    assert!(worker_requests(&gated, "gated").contains(&(
        "kueue.x-k8s.io".into(),
        "localqueues".into(),
        "watch".into()
    )));
    let unknown = std::panic::catch_unwind(|| {
        worker_requests(
            &json!({"integrations": {"frameworks": ["example.com/foo"]}}),
            "x",
        )
    });
    assert!(unknown.is_err(), "an integration FRAMEWORKS lacks fails");
}

/// docs/deploy.md, "Integrations on workers": its table is [`FRAMEWORKS`], row for row.
#[test]
fn deploy_md_integrations_table_is_the_one_the_tests_hold() {
    let text = std::fs::read_to_string(repo().join("docs/deploy.md")).expect("deploy.md");
    let at = text
        .find("### Integrations on workers")
        .expect("docs/deploy.md has \"Integrations on workers\"");
    let rows: Vec<Vec<String>> = text[at..]
        .lines()
        .skip_while(|l| !l.starts_with("| integration"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_owned())
                .collect()
        })
        .collect();
    let from_doc: Vec<(String, String, String, Vec<String>)> = rows
        .iter()
        .map(|r| {
            let group = if r[1] == "\"\" (core)" || r[1].starts_with("\"\"") {
                String::new()
            } else {
                r[1].clone()
            };
            let verbs = if r[3].starts_with("none") {
                Vec::new()
            } else {
                // Drop the notes in parentheses (they hold commas too), then split.
                let mut bare = String::new();
                let mut depth = 0;
                for c in r[3].chars() {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ if depth == 0 => bare.push(c),
                        _ => {}
                    }
                }
                bare.split(',').map(|v| v.trim().to_owned()).collect()
            };
            (r[0].clone(), group, r[2].clone(), verbs)
        })
        .collect();
    let held: Vec<(String, String, String, Vec<String>)> = FRAMEWORKS
        .iter()
        .map(|(f, g, r, v)| {
            (
                (*f).to_owned(),
                (*g).to_owned(),
                (*r).to_owned(),
                v.iter().map(|s| (*s).to_owned()).collect(),
            )
        })
        .collect();
    assert_eq!(
        from_doc, held,
        "docs/deploy.md's table and FRAMEWORKS differ"
    );
}

/// Both Kueue configuration components: Kueue's default configuration of their version with
/// the credbroker sections, `batch/job` only, and the same entries, gates and frameworks; the
/// only difference in what credbroker adds is the list's name.
#[test]
fn kueue_config_components_differ_only_in_the_list_name() {
    let mut sections = Vec::new();
    for ((dir, list_name), version) in KUEUE_CONFIG_COMPONENTS
        .iter()
        .zip([SHIPPED_KUEUE_VERSION, OLDER_KUEUE_VERSION])
    {
        let file = format!("{dir}/{KUEUE_CONFIG_KEY}");
        let text = std::fs::read_to_string(repo().join(&file)).expect("read the component");
        assert!(
            text.contains(&format!("Kueue {version}'s default configuration")),
            "{file} says whose configuration it carries"
        );
        let mut config = parse_yaml(&text, &file);
        assert_eq!(
            strings(&config["integrations"]["frameworks"], "frameworks"),
            ["batch/job"],
            "{file}: MultiKueue watches every enabled integration's kind on every worker"
        );
        let profile = config["multiKueue"]["clusterProfile"]
            .as_object()
            .unwrap_or_else(|| panic!("{file}: no multiKueue.clusterProfile"));
        let keys: Vec<&String> = profile.keys().collect();
        assert_eq!(keys, [list_name], "{file}: the list is {list_name}");
        let entries = profile[*list_name].clone();
        // Kueue's own default, from the module of that version, is the rest of the file.
        let default_file = kueue::kueue_dir(version)
            .join("config/components/manager/controller_manager_config.yaml");
        let default = parse_yaml(
            &std::fs::read_to_string(&default_file).expect("Kueue's default config"),
            &default_file.display().to_string(),
        );
        let obj = config.as_object_mut().expect("a map");
        let ours: BTreeMap<String, Value> = ["integrations", "featureGates", "multiKueue"]
            .into_iter()
            .map(|k| (k.to_owned(), obj.remove(k).unwrap_or(Value::Null)))
            .collect();
        let mut default = default;
        default
            .as_object_mut()
            .expect("a map")
            .remove("integrations");
        assert_eq!(
            config, default,
            "{file}: apart from integrations, featureGates and multiKueue it is Kueue {version}'s default"
        );
        sections.push((
            file,
            ours["featureGates"].clone(),
            ours["integrations"].clone(),
            entries,
        ));
    }
    let (first, rest) = sections.split_first().expect("two components");
    for other in rest {
        assert_eq!(
            first.1, other.1,
            "{} and {}: featureGates",
            first.0, other.0
        );
        assert_eq!(
            first.2, other.2,
            "{} and {}: integrations",
            first.0, other.0
        );
        assert_eq!(
            first.3, other.3,
            "{} and {}: the exec entries",
            first.0, other.0
        );
    }
}

/// Defect: Kueue v0.15-v0.18 decode their configuration strictly and know only
/// `credentialsProviders`, so `kueue-config` (v0.19's `accessProviders`) stopped their manager at
/// start. Section 3's kustomization, with `kueue-config-credentials-providers` listed instead as
/// it says, over Kueue v0.17.0's config/default, gives a configuration Kueue v0.17.0's own
/// binary loads; `kueue-config`'s is refused by it, naming the unknown field, and loaded by
/// v0.19.2.
#[test]
fn older_kueue_loads_the_credentials_providers_component() {
    let (component, _) = OLDER_KUEUE_COMPONENT[0];
    let short = component.rsplit('/').next().expect("a name");
    let doc = std::fs::read_to_string(repo().join("docs/deploy.md")).expect("deploy.md");
    let section3 =
        &doc[doc.find("## 3. ").expect("section 3")..doc.find("## 4. ").expect("section 4")];
    assert!(
        section3.contains(&format!("list `{short}` instead of `kueue-config`")),
        "docs/deploy.md, section 3, tells users of Kueue v0.15-v0.18 to list {short}"
    );
    let files = user_files_from_deploy_md();
    let kustomization = &files["kustomization.yaml"];
    let release = format!(
        "https://github.com/kubernetes-sigs/kueue/releases/download/{SHIPPED_KUEUE_VERSION}/manifests.yaml"
    );
    let tmp = tempdir();
    kueue::deploy_over_kueue(&repo(), &tmp.path().join("credbroker"), OLDER_KUEUE_VERSION);
    let user = tmp.path().join(USER_DIR);
    std::fs::create_dir_all(user.join("credbroker-config")).expect("mkdir");
    let older_default = kueue::relative_path(
        &user,
        &kueue::kueue_dir(OLDER_KUEUE_VERSION).join("config/default"),
    );
    let needle = "deploy/kueue/components/kueue-config ";
    assert!(
        kustomization.contains(needle),
        "section 3 lists kueue-config"
    );
    let older = kustomization
        .replace(&release, older_default.to_str().expect("UTF-8"))
        .replace(needle, &format!("deploy/kueue/components/{short} "));
    for (path, text) in [
        ("kustomization.yaml", older.as_str()),
        (
            "credbroker-config/kustomization.yaml",
            files["credbroker-config/kustomization.yaml"].as_str(),
        ),
        (
            "credbroker-config/credbroker.yaml",
            files["credbroker-config/credbroker.yaml"].as_str(),
        ),
    ] {
        std::fs::write(user.join(path), text).expect("write the user's overlay");
    }
    let out = run(
        Command::new(kubectl()).arg("kustomize").arg(&user),
        COMMAND_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "kubectl kustomize {USER_DIR} for Kueue {OLDER_KUEUE_VERSION}: {}",
        describe(&out)
    );
    let objects = parse_yaml_stream(&String::from_utf8_lossy(&out.stdout), "older Kueue");
    let older_text = kueue_config_text(&objects);
    let older_config = parse_yaml(&older_text, "the older component's config");
    assert!(
        older_config["multiKueue"]["clusterProfile"]["credentialsProviders"].is_array(),
        "the rendered configuration is the older component's"
    );

    let shipped_text = kueue_config_text(&render_over(OVERLAYS[0].0, OLDER_KUEUE_VERSION));
    assert_eq!(
        kueue::kueue_loads_config(OLDER_KUEUE_VERSION, &older_text, &tmp.path().join("older")),
        kueue::ConfigVerdict::Loaded,
        "Kueue {OLDER_KUEUE_VERSION} loads section 3's configuration with {short}"
    );
    match kueue::kueue_loads_config(
        OLDER_KUEUE_VERSION,
        &shipped_text,
        &tmp.path().join("refused"),
    ) {
        kueue::ConfigVerdict::Refused(line) => assert!(
            line.contains("accessProviders") && line.contains("unknown field"),
            "Kueue {OLDER_KUEUE_VERSION} refuses kueue-config for its unknown list name: {line}"
        ),
        kueue::ConfigVerdict::Loaded => panic!(
            "Kueue {OLDER_KUEUE_VERSION} loaded kueue-config's accessProviders: is the strict \
             decoding check broken?"
        ),
    }
    assert_eq!(
        kueue::kueue_loads_config(
            SHIPPED_KUEUE_VERSION,
            &shipped_text,
            &tmp.path().join("shipped")
        ),
        kueue::ConfigVerdict::Loaded,
        "Kueue {SHIPPED_KUEUE_VERSION} loads kueue-config"
    );
}
