//! The binary's command line: clear errors for bad settings, before anything listens.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flexinfer-proxy"))
}

#[test]
fn serve_without_a_config_file_says_what_is_missing() {
    let out = bin()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--gauge",
            "userspace",
        ])
        .env_remove("FLEXINFER_PROXY_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--config"), "{err}");
}

#[test]
fn a_broken_models_file_is_refused_at_start() {
    let dir = std::env::temp_dir().join(format!("fp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.yaml");
    std::fs::write(&cfg, "models:\n  - name: a\n    routing: fastest\n").unwrap();
    let out = bin()
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
        .arg(&cfg)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown routing strategy"), "{err}");
}

#[test]
fn help_lists_the_spec_knobs() {
    let out = bin().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for env in [
        "PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH",
        "PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH",
        "PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH",
        "PROXY_LEAST_LOADED_RESERVATION_TTL",
        "FLEXINFER_PROXY_LABEL_GROUP_ROUTING",
    ] {
        assert!(help.contains(env), "--help does not mention {env}");
    }
}
