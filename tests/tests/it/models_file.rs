//! The models-file builder the tests and `xtask bench` use renders what the proxy's own file
//! parser reads, field by field; unset fields take the parser's defaults.

use std::net::SocketAddr;

use flexinfer_tests::{ModelEntry, ModelsFile};
use routing_userspace::discovery::{file, Strategy};

#[test]
fn every_builder_field_reaches_the_proxys_parser() {
    let text = ModelsFile::new()
        .model(
            ModelEntry::new("my-model")
                .routing("prefix")
                .served_model_name("llama3:8b")
                .service_label("chat")
                .route_priority(100)
                .ready(false)
                .service_at("127.0.0.1:9000")
                .endpoint("127.0.0.1:9001")
                .endpoints(["[::1]:9002"]),
        )
        .model(ModelEntry::new("plain"))
        .to_yaml();
    let models = file::parse(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    assert_eq!(models.len(), 2, "{text}");
    let m = &models[0];
    assert_eq!(m.name, "my-model");
    assert_eq!(m.routing, Strategy::Prefix);
    assert_eq!(m.served_model_name.as_deref(), Some("llama3:8b"));
    assert_eq!(m.service_label.as_deref(), Some("chat"));
    assert_eq!(m.route_priority, 100);
    assert!(!m.ready);
    assert_eq!(m.service.as_deref(), Some("http://127.0.0.1:9000"));
    let want: Vec<SocketAddr> = vec![
        "127.0.0.1:9001".parse().unwrap(),
        "[::1]:9002".parse().unwrap(),
    ];
    assert_eq!(m.endpoints, want);

    let d = &models[1];
    assert_eq!(d.routing, Strategy::Default);
    assert_eq!((d.route_priority, d.ready), (0, true));
    assert!(d.served_model_name.is_none() && d.service_label.is_none() && d.service.is_none());
    assert!(d.endpoints.is_empty());
}

#[test]
fn each_strategy_name_parses_and_a_bad_one_is_the_parsers_error() {
    for (name, want) in [
        ("session-affinity", Strategy::SessionAffinity),
        ("prefix", Strategy::Prefix),
        ("least-loaded", Strategy::LeastLoaded),
        ("default", Strategy::Default),
    ] {
        let text = ModelsFile::new()
            .model(ModelEntry::new("m").routing(name))
            .to_yaml();
        assert_eq!(file::parse(&text).unwrap()[0].routing, want, "{name}");
    }
    let bad = ModelsFile::new()
        .model(ModelEntry::new("m").routing("fastest"))
        .to_yaml();
    assert!(file::parse(&bad).is_err());
}
