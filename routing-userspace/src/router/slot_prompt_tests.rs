//! Proxies of a fleet that read what llama.cpp pods say their slots hold (`/slots` with the
//! prompts shown): a document another proxy placed off its hash is found where it is, new
//! documents go where the pods hold least, the same way in every proxy that has the same view,
//! and among pods that hold alike, proxies of distinct ranks place documents no pod holds on
//! distinct pods, the same document or different ones.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::test_world::{model, World};
use super::RoutingKnobs;
use crate::signals::slot_prompts::{PodPrompts, SlotPrompt};
use crate::table::Route;
use crate::vocab::Strategy;

/// Document `d`: a heading of its own, then text all documents share in another order.
fn document(d: usize) -> String {
    let sentences = [
        "Routing keeps a conversation on the replica that holds its cache.",
        "A shared system prompt is computed once per replica that serves it.",
        "Bounded loads stop one replica from queueing while others idle.",
        "Every answer must cite the section of the document it comes from.",
    ];
    let body: Vec<&str> = (0..60).map(|i| sentences[(d + i * 3) % 4]).collect();
    format!(
        "Answer from this document only. Document {d}: {}",
        body.join(" ")
    )
}

fn request(d: usize, q: usize) -> String {
    serde_json::json!({"model": "ca", "messages": [
        {"role": "system", "content": document(d)},
        {"role": "user", "content": format!("Question {q}: what does it say about replicas?")}
    ]})
    .to_string()
}

/// A slot's prompt as llama.cpp renders the request.
fn rendered(d: usize, q: usize) -> String {
    format!(
        "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\nQuestion {q}: what does it say about replicas?<|im_end|>\n<|im_start|>assistant\n",
        document(d)
    )
}

fn fleet_world() -> World {
    fleet_world_at(0)
}

/// The router of rank `rank` in a fleet of three.
fn fleet_world_at(rank: usize) -> World {
    fleet_of(3, rank)
}

/// The router of rank `rank` among `proxies`, in front of three pods.
fn fleet_of(proxies: usize, rank: usize) -> World {
    World::new(
        vec![model("ca", Strategy::CacheAware, [1, 2, 3])],
        RoutingKnobs::default(),
    )
    .in_fleet_at(proxies, rank)
}

/// Each pod's views: the documents its slots hold.
fn show(w: &World, held: &[&[usize]]) {
    let Some(Route::Model(m)) = w.table.lookup("ca") else {
        unreachable!("one model")
    };
    for (pod, docs) in m.pods.iter().zip(held) {
        let slots = docs
            .iter()
            .map(|&d| std::sync::Arc::new(SlotPrompt::of(&rendered(d, 99))))
            .collect();
        let view = PodPrompts::new(slots, Instant::now(), Duration::from_secs(60));
        w.router
            .signals()
            .prompts()
            .set(pod.slot.expect("a slot"), Some(view));
    }
}

fn pick(w: &World, d: usize, q: usize) -> SocketAddr {
    w.simple("ca", &request(d, q))
        .picked_pod()
        .expect("a pod")
        .addr
}

fn pods() -> Vec<SocketAddr> {
    [1, 2, 3].map(super::test_world::addr).to_vec()
}

#[test]
fn a_document_placed_off_its_hash_is_found_where_its_pod_says_it_is() {
    for d in 0..8 {
        let by_hash = pick(&fleet_world(), d, 1);
        for (i, &elsewhere) in pods().iter().enumerate() {
            if elsewhere == by_hash {
                continue;
            }
            let w = fleet_world();
            // The pod `elsewhere` holds document d, the others hold other documents.
            let mut held: Vec<Vec<usize>> = vec![vec![100 + i], vec![200 + i], vec![300 + i]];
            held[i] = vec![d];
            let held: Vec<&[usize]> = held.iter().map(Vec::as_slice).collect();
            show(&w, &held);
            assert_eq!(pick(&w, d, 2), elsewhere, "document {d}");
            // Its decision says what it matched: the whole document.
            let decision = w.simple("ca", &request(d, 3));
            assert!(
                decision.match_depth() >= Some(3),
                "{:?}",
                decision.match_depth()
            );
        }
    }
}

#[test]
fn new_documents_go_where_the_pods_hold_least_alike_in_every_proxy() {
    let (a, b) = (fleet_world(), fleet_world());
    // Pods 1 and 2 hold two documents each, pod 3 none.
    let held: [&[usize]; 3] = [&[50, 51], &[52, 53], &[]];
    show(&a, &held);
    show(&b, &held);
    let mut documents = [2, 2, 0];
    for d in 0..12 {
        let p = pick(&a, d, 1);
        assert_eq!(pick(&b, d, 1), p, "document {d}");
        if d < 2 {
            assert_eq!(p, super::test_world::addr(3), "document {d}");
        }
        documents[pods().iter().position(|&x| x == p).expect("a pod")] += 1;
    }
    // What each pick sent counts until the next read: the pods stay even.
    let (most, least) = (documents.iter().max(), documents.iter().min());
    assert!(
        most.zip(least).is_some_and(|(m, l)| m - l <= 1),
        "{documents:?}"
    );
    // With a pod's view missing, the proxies place by the hash again (as they do without
    // views), and agree.
    let (c, d) = (fleet_world(), fleet_world());
    show(&c, &held[..2]);
    show(&d, &held[..2]);
    let spread: std::collections::BTreeSet<SocketAddr> = (0..24)
        .map(|doc| {
            let p = pick(&c, doc, 1);
            assert_eq!(pick(&d, doc, 1), p);
            p
        })
        .collect();
    assert!(spread.len() >= 2, "{spread:?}");
}

#[test]
fn proxies_of_distinct_ranks_place_a_document_no_pod_holds_on_distinct_pods() {
    let empty: [&[usize]; 3] = [&[], &[], &[]];
    for d in 0..8 {
        let placed: std::collections::BTreeSet<SocketAddr> = (0..3)
            .map(|rank| {
                let w = fleet_world_at(rank);
                show(&w, &empty);
                pick(&w, d, 1)
            })
            .collect();
        assert_eq!(placed.len(), 3, "document {d}: {placed:?}");
        // Once a pod shows it, every proxy sends its questions there, whatever its rank.
        let holder = d % 3;
        let mut held: [&[usize]; 3] = empty;
        let doc = [d];
        held[holder] = &doc;
        for rank in 0..3 {
            let w = fleet_world_at(rank);
            show(&w, &held);
            assert_eq!(pick(&w, d, 2), pods()[holder], "document {d}, rank {rank}");
        }
        // Pods that hold unevenly: the one that holds least takes it, whatever the rank.
        let uneven: [&[usize]; 3] = [&[50, 51], &[], &[52, 53]];
        for rank in 0..3 {
            let w = fleet_world_at(rank);
            show(&w, &uneven);
            assert_eq!(pick(&w, d, 1), pods()[1], "document {d}, rank {rank}");
        }
    }
}

#[test]
fn proxies_of_distinct_ranks_place_different_new_documents_got_at_once_on_distinct_pods() {
    let empty: [&[usize]; 3] = [&[], &[], &[]];
    // Three documents at once, one through each proxy, before any page shows one of them:
    // whatever the documents, three pods (in each document's own walk, two met on one pod
    // for most triples).
    for first in 0..12 {
        let placed: std::collections::BTreeSet<SocketAddr> = (0..3)
            .map(|rank| {
                let w = fleet_world_at(rank);
                show(&w, &empty);
                pick(&w, first * 3 + rank, 1)
            })
            .collect();
        assert_eq!(placed.len(), 3, "documents from {}: {placed:?}", first * 3);
    }
    // Two proxies in front of three pods, placing new documents in step before the pages
    // show any: at each step they take two pods, and what each sent moves its next document
    // on, so each proxy's documents go round all three.
    let proxies = [fleet_of(2, 0), fleet_of(2, 1)];
    for w in &proxies {
        show(w, &empty);
    }
    let mut each = [std::collections::BTreeSet::new(), Default::default()];
    for step in 0..3 {
        let at_once: Vec<SocketAddr> = proxies
            .iter()
            .enumerate()
            .map(|(rank, w)| {
                let p = pick(w, 100 + step * 2 + rank, 1);
                each[rank].insert(p);
                p
            })
            .collect();
        assert_ne!(at_once[0], at_once[1], "step {step}");
    }
    assert_eq!(each[0].len(), 3, "{each:?}");
    assert_eq!(each[1].len(), 3, "{each:?}");
}

#[test]
fn where_every_pod_holds_as_much_a_new_document_goes_where_its_documents_are_held_twice() {
    // Every pod's slots are full: pods 0 and 1 hold two documents each that no other pod
    // holds; pod 2 holds two that pods 0 and 1 hold too. Room made there loses nothing.
    let full: [&[usize]; 3] = [&[10, 11], &[12, 13], &[10, 12]];
    for rank in 0..3 {
        let w = fleet_world_at(rank);
        show(&w, &full);
        for d in 0..4 {
            assert_eq!(pick(&w, d, 1), pods()[2], "document {d}, rank {rank}");
            show(&w, &full);
        }
    }
}
