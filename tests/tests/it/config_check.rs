//! `flexinfer-proxy config check FILE` through the binary: exit status 0 and the routing of each
//! model for a good file (the example the quickstart uses), exit status 1 and
//! `FILE:LINE:COLUMN: message` on stderr for each kind of mistake, and agreement with `serve`.

use std::process::{Command, Output};

use flexinfer_tests::{proxy_bin, TempDir};

fn check(file: &std::path::Path) -> Output {
    Command::new(proxy_bin())
        .args(["config", "check"])
        .arg(file)
        .env_remove("FLEXINFER_PROXY_LABEL_GROUP_ROUTING")
        .output()
        .expect("run flexinfer-proxy config check")
}

fn example() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/models.yaml")
}

#[test]
fn the_quickstart_example_passes_and_is_described() {
    let out = check(&example());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stderr.is_empty());
    assert!(
        stdout
            .lines()
            .next()
            .is_some_and(|l| l.ends_with("models.yaml: ok, 3 models, 1 label group")),
        "{stdout}"
    );
    for line in [
        "model llama3-8b",
        "  routing:           prefix (consistent hash of the cache key over 2 pods; no key: the service; connect failures try the next pods, then the service)",
        "  served model name: meta-llama/Meta-Llama-3-8B-Instruct (the body's \"model\" is rewritten)",
        "label group chat (mode round-robin)",
        "  priority 100: qwen-fast",
        "  priority 0: qwen-fallback",
    ] {
        assert!(stdout.lines().any(|l| l == line), "no {line:?} in\n{stdout}");
    }
    assert!(!stdout.contains("warning"), "{stdout}");
}

#[test]
fn the_label_group_mode_comes_from_the_serve_environment() {
    let out = Command::new(proxy_bin())
        .args(["config", "check"])
        .arg(example())
        .env("FLEXINFER_PROXY_LABEL_GROUP_ROUTING", "least-loaded")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("label group chat (mode least-loaded)"),
        "{stdout}"
    );
}

#[test]
fn each_kind_of_mistake_exits_1_and_names_line_and_column() {
    let dir = TempDir::new("config-check");
    for (name, text, want) in [
        (
            "typo.yaml",
            "models:\n  - name: a\n    endpoints: [127.0.0.1:9001]\n    sevice: http://127.0.0.1:9000\n",
            ":4:5: models[0]: unknown field `sevice`, expected one of",
        ),
        (
            "routing.yaml",
            "models:\n  - name: a\n    routing: fastest\n",
            ":3:14: models[0].routing: unknown routing strategy \"fastest\"",
        ),
        (
            "address.yaml",
            "models:\n  - name: a\n    endpoints:\n      - 127.0.0.1:9001\n      - pod-1:9002\n",
            ":5:9: models[0].endpoints[1]: endpoint \"pod-1:9002\" is not IP:port",
        ),
        (
            "duplicate.yaml",
            "models:\n  - name: a\n    endpoints: [127.0.0.1:9001]\n  - name: b\n  - name: a\n",
            ":5:5: models[2]: model \"a\" is listed twice",
        ),
        (
            "syntax.yaml",
            "models:\n  - name: a\n   routing: prefix\n",
            ":3:4: did not find expected '-' indicator",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = check(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
        let want = format!("{}{want}", path.display());
        assert!(stderr.starts_with(&want), "{name}:\n got  {stderr}\n want {want}");

        // `serve` refuses the same file, with the same position.
        let serve = Command::new(proxy_bin())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--gauge",
                "userspace",
                "--config",
            ])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!serve.status.success(), "{name}: serve accepted it");
        let serve_err = String::from_utf8_lossy(&serve.stderr);
        let line_col = want.rsplit_once(".yaml:").unwrap().1;
        let (line, rest) = line_col.split_once(':').unwrap();
        let col = rest.split_once(':').unwrap().0;
        assert!(
            serve_err.contains(&format!("line {line} column {col}")),
            "{name}: {serve_err}"
        );
    }
}

#[test]
fn an_unreadable_file_exits_1() {
    let out = check(std::path::Path::new("/nonexistent/models.yaml"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/models.yaml"));
}

#[test]
fn the_quickstart_capture_is_what_check_prints() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/quickstart.md")).unwrap();
    let command = "$ flexinfer-proxy config check docs/examples/models.yaml\n";
    let start = doc
        .find(command)
        .expect("the capture in docs/quickstart.md")
        + command.len();
    let captured = &doc[start..start + doc[start..].find("```").unwrap()];
    let out = Command::new(proxy_bin())
        .current_dir(&root)
        .args(["config", "check", "docs/examples/models.yaml"])
        .env_remove("FLEXINFER_PROXY_LABEL_GROUP_ROUTING")
        .env_remove("FLEXINFER_PROXY_HASH_BALANCE_FACTOR")
        .env_remove("FLEXINFER_PROXY_HASH_BALANCE_FLOOR")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        captured,
        String::from_utf8_lossy(&out.stdout),
        "docs/quickstart.md shows another output"
    );
}
