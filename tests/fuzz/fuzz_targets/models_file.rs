//! The models file parser (`discovery::file::parse`) and `config check` on arbitrary text.
//!
//! The proxy re-reads this file while it serves; a file that does not parse must come back as
//! an error with a position (the log line and `config check` point at it), never a panic, and a
//! file that parses must mean what it says. Checked: an error has a line and a column together
//! or neither, both 1-based and inside the text, whenever serde's message names a position;
//! `config check` agrees with the parser and leads its message with `FILE:LINE:COLUMN`; an
//! accepted file has unique, non-empty names, http:// Services, and writes back to YAML that
//! parses to the same models.
#![no_main]

use std::path::Path;

use flexinfer_fuzz::yaml_lines;
use libfuzzer_sys::fuzz_target;
use routing_userspace::discovery::check::check;
use routing_userspace::discovery::file::parse;
use routing_userspace::discovery::{ModelSpec, Strategy};
use serde::Serialize;

/// The file format, written back from parsed models (every field explicit).
#[derive(Serialize)]
struct File<'a> {
    models: Vec<Entry<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Entry<'a> {
    name: &'a str,
    routing: &'a str,
    served_model_name: Option<&'a str>,
    service_label: Option<&'a str>,
    route_priority: i64,
    ready: bool,
    service: Option<&'a str>,
    endpoints: Vec<String>,
}

fn write_back(models: &[ModelSpec]) -> String {
    let file = File {
        models: models
            .iter()
            .map(|m| Entry {
                name: &m.name,
                routing: m.routing.as_str(),
                served_model_name: m.served_model_name.as_deref(),
                service_label: m.service_label.as_deref(),
                route_priority: m.route_priority,
                ready: m.ready,
                service: m.service.as_deref(),
                endpoints: m.endpoints.iter().map(|e| e.to_string()).collect(),
            })
            .collect(),
    };
    serde_yaml_ng::to_string(&file).expect("models serialize")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("models.yaml");
    let parsed = parse(text);
    let checked = check(path, text);
    match &parsed {
        Err(e) => {
            assert_eq!(e.line.is_some(), e.column.is_some(), "{e:?}");
            if let (Some(l), Some(c)) = (e.line, e.column) {
                assert!(l >= 1 && c >= 1, "{e:?}");
                // serde_yaml_ng may point one line past the last (at the end of input).
                let lines = yaml_lines(text);
                assert!(l <= lines + 1, "line {l} of a text of {lines} lines: {e:?}");
            }
            if e.message.contains(" at line ") && e.message.contains(" column ") {
                assert!(
                    e.line.is_some(),
                    "the message has a position the error lacks: {e:?}"
                );
            }
            let c = checked.expect_err("config check accepts what the parser refuses");
            let shown = c.to_string();
            match (e.line, e.column) {
                (Some(l), Some(col)) => {
                    assert!(
                        shown.starts_with(&format!("models.yaml:{l}:{col}: ")),
                        "{shown}"
                    )
                }
                _ => assert!(shown.starts_with("models.yaml: "), "{shown}"),
            }
        }
        Ok(models) => {
            assert!(
                checked.is_ok(),
                "config check refuses what the parser accepts"
            );
            let mut names = std::collections::HashSet::new();
            for m in models {
                assert!(!m.name.trim().is_empty(), "{m:?}");
                assert!(names.insert(m.name.as_str()), "{:?} twice", m.name);
                if let Some(s) = &m.service {
                    assert!(s.starts_with("http://") && s.len() > 7, "{s:?}");
                }
                assert!(Strategy::ALL.contains(&m.routing));
            }
            let again = write_back(models);
            match parse(&again) {
                Ok(back) => assert_eq!(&back, models, "written back:\n{again}"),
                Err(e) => panic!("the written-back file does not parse: {e:?}\n{again}"),
            }
        }
    }
});
