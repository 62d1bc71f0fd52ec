#!/usr/bin/env python3
"""Writes the seed corpus (tests/fuzz/corpus/<target>/) from the lists below.

The seeds are small, realistic inputs: what clients, pods, operators and the API server send.
Each file is named after what it shows, so a person can read the corpus. Run it again after
editing a list; it rewrites the seed directories whole.
"""
import json, os, shutil

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")


def chat(model="chat-model", system=None, user="Where is my parcel?", extra=None, stream=None):
    msgs = []
    if system is not None:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": user})
    body = {"model": model, "messages": msgs, "max_tokens": 16}
    if stream is not None:
        body["stream"] = stream
    body.update(extra or {})
    return json.dumps(body)


SYSTEM = "You are the support assistant of Northwind Logistics. Answer briefly."
DOC = "Invoice 2024-118: 3 pallets, Rotterdam to Basel, customs cleared."

BODIES = {
    "chat-system-user": chat(system=SYSTEM),
    "chat-stream": chat(system=SYSTEM, stream=True),
    "chat-user-only": chat(),
    "chat-two-turns": json.dumps({"model": "chat-model", "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Track NW-1"}]}),
    "chat-developer-role": json.dumps({"model": "m", "messages": [
        {"role": "developer", "content": "Be terse."}, {"role": "user", "content": "x"}]}),
    "chat-content-parts": json.dumps({"model": "m", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Part one."},
                                        {"type": "image_url", "image_url": {"url": "data:"}},
                                        {"type": "input_text", "text": "Part two."}]},
        {"role": "user", "content": [{"text": "untyped part"}]}]}),
    "chat-null-content": json.dumps({"model": "m", "messages": [
        {"role": "assistant", "content": None, "tool_calls": []}, {"role": "user", "content": "q"}]}),
    "chat-bad-message": json.dumps({"model": "m", "messages": [
        {"role": "system", "content": "S"}, {"role": 7, "content": "x"}]}),
    "chat-message-as-array": '{"model":"m","messages":[["system","S"],["user","U"]]}',
    "cache-key": chat(extra={"cache_key": "tenant-7:doc-42"}),
    "cache-key-camel": chat(extra={"cacheKey": "tenant.7/doc=42"}),
    "cache-key-malformed": chat(extra={"cache_key": "has spaces!", "prefix": "legacy-1"}),
    "cache-key-too-long": chat(extra={"cache_key": "k" * 200}),
    "cache-key-number": chat(extra={"cache_key": 42, "cacheKey": "ok-1"}),
    "prefix-field": chat(extra={"prefix": "  shared-prefix-9  "}),
    "session-id": chat(extra={"session_id": "user-123-conversation-456"}),
    "session-id-blank": chat(extra={"session_id": "   "}),
    "document-context": chat(system=SYSTEM, extra={"document_context": DOC}),
    "document-context-camel": chat(extra={"documentContext": DOC, "context": "other"}),
    "documents-objects": chat(extra={"documents": [{"text": DOC}, {"text": "second"}]}),
    "documents-content": chat(extra={"documents": [{"title": "t", "content": DOC}]}),
    "documents-strings": chat(extra={"documents": [DOC, "more"]}),
    "completions-prompt": json.dumps({"model": "m", "prompt": SYSTEM + " Q: hi", "max_tokens": 8}),
    "completions-prompt-list": json.dumps({"model": "m", "prompt": ["first", "second"]}),
    "completions-prompt-mixed": json.dumps({"model": "m", "prompt": ["first", 2]}),
    "escapes": '{"model":"mod\\u0065l","messages":[{"role":"system","content":"tab\\there \\"q\\" \\u00e9 \\ud83d\\ude00"},{"role":"user","content":"\\n"}]}',
    "escaped-key": '{"mod\\u0065l":"m","session_\\u0069d":"s-1"}',
    "whitespace-heavy": ' \n { "model" : "m" ,\n\t"messages" : [ { "role" : "system" , "content" : "  a   b\\n\\n c  " } ] } \n',
    "unicode": chat(system="Système: réponds en français, s'il te plaît. 日本語も可。", user="Où est mon colis ?"),
    "model-null": '{"model":null,"messages":[]}',
    "model-number": '{"model":3.5e2,"messages":[]}',
    "duplicate-model": '{"model":"a","messages":[],"model":"b"}',
    "duplicate-unknown": '{"x":1,"x":2,"model":"m"}',
    "not-object": '[{"model":"m"}]',
    "truncated": '{"model":"m","messages":[{"role":"user","content":"cut',
    "trailing-garbage": '{"model":"m"} x',
    "lone-surrogate": '{"model":"m","x":"\\ud800"}',
    "deep": '{"model":"m","x":' + "[" * 130 + "]" * 130 + "}",
    "big-number": '{"model":"m","temperature":1e400,"n":-0.0e-5}',
    "empty-object": "{}",
}

KEY_HEADERS = {
    "none": [],
    "session-header": ["x-session-id: user-123"],
    "session-header-blank": ["x-session-id:    "],
    "conversation-header": ["x-conversation-id: conv-9"],
    "both-session-headers": ["x-session-id: s", "x-conversation-id: c"],
    "cache-key-header": ["x-flexinfer-cache-key: tenant-1:doc-2"],
    "cache-key-header-bad": ["x-flexinfer-cache-key: not valid"],
    "cache-key-header-long": ["x-flexinfer-cache-key: " + "a" * 130],
    "cache-key-and-session": ["x-flexinfer-cache-key: k1", "x-session-id: s1"],
    "model-header": ["x-model-id: routed-model"],
    "model-header-and-session": ["x-model-id: routed-model", "x-session-id: s-2"],
}

KEY_SEEDS = [
    ("none", "chat-system-user"), ("none", "chat-two-turns"), ("none", "chat-content-parts"),
    ("none", "cache-key"), ("none", "cache-key-camel"), ("none", "cache-key-malformed"),
    ("none", "cache-key-too-long"), ("none", "prefix-field"), ("none", "session-id"),
    ("none", "session-id-blank"), ("none", "document-context"), ("none", "documents-objects"),
    ("none", "completions-prompt"), ("none", "escapes"), ("none", "unicode"),
    ("session-header", "chat-system-user"), ("session-header", "cache-key"),
    ("session-header-blank", "session-id"), ("conversation-header", "session-id"),
    ("both-session-headers", "chat-user-only"), ("cache-key-header", "cache-key"),
    ("cache-key-header-bad", "cache-key-camel"), ("cache-key-header-long", "prefix-field"),
    ("cache-key-and-session", "document-context"), ("model-header", "chat-system-user"),
    ("model-header", "completions-prompt-list"), ("model-header-and-session", "document-context-camel"),
    ("none", "chat-bad-message"), ("none", "whitespace-heavy"), ("session-header", "not-object"),
]

RESOLVE = {
    "plain-chat": ("/v1/chat/completions", []),
    "model-header": ("/v1/chat/completions", ["x-model-id: llama3"]),
    "model-header-padded": ("/v1/chat/completions", ["x-model-id:   llama3  "]),
    "model-header-blank": ("/v1/chat/completions", ["x-model-id:  "]),
    "path-prefix": ("/model/llama3/v1/chat/completions", []),
    "path-prefix-query": ("/model/llama3/v1/models?limit=5&x=%20", []),
    "path-prefix-encoded": ("/model/llama3%3A8b/v1/completions", []),
    "path-prefix-encoded-slash": ("/model/org%2Fname/v1/x", []),
    "path-prefix-utf8": ("/model/m%C3%BCnchen/v1/x", []),
    "path-prefix-bad-escape": ("/model/bad%zz/v1/x", []),
    "path-prefix-bad-utf8": ("/model/%ff%fe/v1/x", []),
    "path-prefix-short-escape": ("/model/a%4/v1", []),
    "path-prefix-only": ("/model/x", []),
    "path-prefix-empty-name": ("/model//v1/chat/completions", []),
    "path-prefix-trailing": ("/model/x/", []),
    "header-and-path": ("/model/from-path/v1/chat/completions", ["x-model-id: from-header"]),
    "absolute-form": ("http://proxy.local:8080/model/m/v1/chat/completions?q=1", []),
    "authority-form": ("proxy.local:8080", []),
    "asterisk": ("*", []),
    "hop-by-hop": ("/v1/chat/completions", ["connection: keep-alive, x-secret", "x-secret: 1",
                                             "keep-alive: timeout=5", "te: trailers",
                                             "transfer-encoding: chunked", "upgrade: h2c",
                                             "proxy-authorization: Basic x"]),
    "forwarded": ("/v1/models", ["x-forwarded-for: 10.1.2.3", "host: proxy:8080",
                                 "x-forwarded-host: outer"]),
    "multi-connection": ("/v1/x", ["connection: close", "connection: x-a, , x-b", "x-a: 1", "x-b: 2"]),
    "obs-text-header": ("/v1/x", ["x-model-id: caf\xe9"]),
    "model-path-lookalike": ("/models/x/v1", []),
    "dot-segments": ("/model/../v1/../x", []),
}

MODELS_FILES = {
    "documented": """models:
  - name: my-model                 # matched against X-Model-ID, /model/<name>/ and body "model"
    routing: prefix
    servedModelName: llama3:8b
    serviceLabel: chat
    routePriority: 100
    ready: true
    service: http://127.0.0.1:9000
    endpoints: [127.0.0.1:9001, "[::1]:9002"]
""",
    "two-models": "models:\n  - name: a\n    routing: least-loaded\n    endpoints: [127.0.0.1:1, 127.0.0.1:2]\n  - name: b\n    routing: session-affinity\n    service: http://svc.ns.svc.cluster.local:8000\n",
    "label-group": "models:\n  - name: small\n    serviceLabel: chat\n    routePriority: 10\n  - name: large\n    serviceLabel: chat\n    routePriority: -5\n    ready: false\n",
    "empty-list": "models: []\n",
    "empty-file": "",
    "comment-only": "# nothing here\n",
    "null-models": "models:\n",
    "flow-style": '{models: [{name: a, endpoints: ["10.0.0.1:80"]}]}\n',
    "json": '{"models":[{"name":"a","routing":"prefix","endpoints":["[fd00::1]:8000"]}]}',
    "quoted-name": "models:\n  - name: \"llama3:8b\"\n  - name: 'with space'\n",
    "unknown-field": "models:\n  - name: a\n    sevice: http://x\n",
    "unknown-top": "modles:\n  - name: a\n",
    "bad-routing": "models:\n  - name: a\n    routing: fastest\n",
    "bad-endpoint": "models:\n  - name: a\n    endpoints: [127.0.0.1:1, nohost]\n",
    "bad-endpoint-port": "models:\n  - name: a\n    endpoints: [\"127.0.0.1:99999\"]\n",
    "bad-service": "models:\n  - name: a\n    service: https://svc:443\n",
    "bare-service": "models:\n  - name: a\n    service: http://\n",
    "duplicate-name": "models:\n  - name: a\n  - name: b\n  - name: a\n",
    "empty-name": "models:\n  - name: \"  \"\n",
    "missing-name": "models:\n  - routing: prefix\n",
    "priority-not-int": "models:\n  - name: a\n    routePriority: high\n",
    "priority-huge": "models:\n  - name: a\n    routePriority: 99999999999999999999\n",
    "ready-string": "models:\n  - name: a\n    ready: maybe\n",
    "tab-indent": "models:\n\t- name: a\n",
    "anchor-alias": "base: &b\n  routing: prefix\nmodels:\n  - name: a\n    <<: *b\n",
    "multi-document": "models: []\n---\nmodels: []\n",
    "name-number": "models:\n  - name: 42\n",
    "models-map": "models:\n  a: {routing: prefix}\n",
    "unicode-name": "models:\n  - name: modèle-日本\n    servedModelName: \"\\u00e9\"\n",
}

KUBE = {
    "full": {
        "model": {"apiVersion": "inference.flexinfer.ai/v1alpha2", "kind": "Model",
                  "metadata": {"name": "llama", "namespace": "ml",
                               "labels": {"flexinfer.ai/service": "chat"},
                               "annotations": {"flexinfer.ai/routing": "prefix",
                                               "flexinfer.ai/route-priority": "100"}},
                  "spec": {"backend": "vllm", "source": "hf://meta/llama", "servedModelName": "llama3"},
                  "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        "service": {"metadata": {"name": "llama", "namespace": "ml"},
                    "spec": {"ports": [{"name": "metrics", "port": 9100},
                                       {"name": "http", "port": 80, "targetPort": 8000}]}},
        "slices": [{"metadata": {"name": "llama-abc", "namespace": "ml",
                                 "labels": {"kubernetes.io/service-name": "llama"}},
                    "addressType": "IPv4", "ports": [{"name": "http", "port": 8000}],
                    "endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": True}},
                                  {"addresses": ["10.0.0.1"]},
                                  {"addresses": ["10.0.0.3"], "conditions": {"ready": False}},
                                  {"addresses": ["10.0.0.4"], "conditions": {"terminating": True}}]}],
    },
    "ipv6-and-dual": {
        "model": {"metadata": {"name": "m"}, "spec": {}},
        "slices": [{"metadata": {"name": "s6"}, "addressType": "IPv6", "ports": [{"port": 8000}],
                    "endpoints": [{"addresses": ["fd00::1"]}, {"addresses": ["fd00::1"]}]},
                   {"metadata": {"name": "s4"}, "addressType": "IPv4", "ports": [{"port": 8000}],
                    "endpoints": [{"addresses": ["10.1.0.1", "10.1.0.2"]}]}],
    },
    "fqdn": {"model": {"metadata": {"name": "m"}, "spec": {}},
             "slices": [{"metadata": {"name": "f"}, "addressType": "FQDN", "ports": [{"port": 80}],
                         "endpoints": [{"addresses": ["pod.example.com"]}]}]},
    "udp-only-service": {"model": {"metadata": {"name": "m", "namespace": "d"}, "spec": {}},
                         "service": {"metadata": {"name": "m"},
                                     "spec": {"ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}},
    "named-target-port": {"model": {"metadata": {"name": "m"}, "spec": {}},
                          "service": {"metadata": {"name": "m"},
                                      "spec": {"ports": [{"name": "x", "port": 80, "targetPort": "web"}]}},
                          "slices": [{"metadata": {"name": "a"}, "addressType": "IPv4",
                                      "ports": [{"name": "a", "port": 1}, {"name": "web", "port": 2}],
                                      "endpoints": [{"addresses": ["10.0.0.9"]}]}]},
    "numeric-target-port": {"model": {"metadata": {"name": "m"}, "spec": {}},
                            "service": {"metadata": {"name": "m"},
                                        "spec": {"ports": [{"name": "x", "port": 80, "targetPort": 2}]}},
                            "slices": [{"metadata": {"name": "a"}, "addressType": "IPv4",
                                        "ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}],
                                        "endpoints": [{"addresses": ["10.0.0.9"]}]}]},
    "port-zero-and-huge": {"model": {"metadata": {"name": "m"}, "spec": {}},
                           "service": {"metadata": {"name": "m"}, "spec": {"ports": [{"port": 0}]}},
                           "slices": [{"metadata": {"name": "a"}, "addressType": "IPv4",
                                       "ports": [{"port": 70000}], "endpoints": [{"addresses": ["10.0.0.1"]}]},
                                      {"metadata": {"name": "b"}, "addressType": "IPv4",
                                       "ports": [{"port": 0}], "endpoints": [{"addresses": ["10.0.0.2"]}]}]},
    "bad-annotations": {"model": {"metadata": {"name": "m", "annotations": {
        "flexinfer.ai/routing": "round-robin", "flexinfer.ai/route-priority": "1.5",
        "flexinfer.ai/service-name": "  other  "}}, "spec": {}}},
    "negative-priority": {"model": {"metadata": {"name": "m", "annotations": {
        "flexinfer.ai/route-priority": " -7 ", "flexinfer.ai/routing": " session "}}, "spec": {}}},
    "blank-label": {"model": {"metadata": {"name": "m", "labels": {"team/svc": "  "}}, "spec": {"servedModelName": " "}},
                    "labelKey": "team/svc"},
    "generate-name": {"model": {"metadata": {"generateName": "m-"}, "spec": {}}},
    "no-name": {"model": {"metadata": {}, "spec": {}}},
    "status-not-ready": {"model": {"metadata": {"name": "m"}, "spec": {},
                                   "status": {"conditions": [{"type": "Ready", "status": "False"},
                                                             {"type": "Ready", "status": "True"}]}}},
    "bare-model": {"apiVersion": "inference.flexinfer.ai/v1alpha2", "kind": "Model",
                   "metadata": {"name": "solo"}, "spec": {"backend": "ollama", "source": "ollama://x"}},
    "bare-service": {"metadata": {"name": "svc", "namespace": "n"}, "spec": {"ports": [{"port": 8080}]}},
    "bare-slice": {"metadata": {"name": "sl"}, "addressType": "IPv4", "ports": [{"port": 1}],
                   "endpoints": [{"addresses": ["1.2.3.4"]}]},
    "not-ip-address": {"model": {"metadata": {"name": "m"}, "spec": {}},
                       "slices": [{"metadata": {"name": "a"}, "addressType": "IPv4", "ports": [{"port": 5}],
                                   "endpoints": [{"addresses": ["not-an-ip"]}, {"addresses": []}]}]},
    "ipv6-in-ipv4-slice": {"model": {"metadata": {"name": "m"}, "spec": {}},
                           "slices": [{"metadata": {"name": "a"}, "addressType": "IPv4", "ports": [{"port": 5}],
                                       "endpoints": [{"addresses": ["::1"]}]}]},
}

RESPONSES = {
    "ok-length": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    "ok-chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "sse": "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nx-sim-pod: pod-1\r\ntransfer-encoding: chunked\r\n\r\n",
    "gzip-chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "te-not-chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
    "te-and-length": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 10\r\n\r\n",
    "close-delimited": "HTTP/1.1 200 OK\r\n\r\nbody until close",
    "connection-close": "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
    "http10": "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "http10-keepalive": "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx",
    "no-content": "HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n",
    "not-modified": "HTTP/1.1 304 Not Modified\r\n\r\n",
    "continue-then-ok": "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
    "early-hints": "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz",
    "switching": "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
    "error-json": "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n" + '{"error":{"message":"busy","type":"server_error","code":"x"}}',
    "double-length": "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    "list-length": "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc",
    "conflicting-length": "HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n",
    "negative-length": "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    "huge-length": "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
    "bare-lf": "HTTP/1.1 200 OK\nContent-Length: 1\n\nx",
    "no-reason": "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
    "status-999": "HTTP/1.1 999 Odd\r\n\r\n",
    "obs-text": "HTTP/1.1 200 OK\r\nX-Name: caf\xe9\r\nContent-Length: 0\r\n\r\n",
    "partial": "HTTP/1.1 200 OK\r\nContent-Le",
    "not-http": "NOT HTTP\r\n\r\n",
    "space-before-colon": "HTTP/1.1 200 OK\r\nContent-Length : 1\r\n\r\nx",
}

CHUNKED = {
    "simple": "5\r\nhello\r\n0\r\n\r\n",
    "two-chunks": "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nNEXT",
    "sse-events": "".join(f"{len(e):x}\r\n{e}\r\n" for e in [
        'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n', "data: [DONE]\n\n"]) + "0\r\n\r\n",
    "extensions": "1;ext=1\r\nx\r\n3 ; name=\"v\"\r\nabc\r\n0;last\r\n\r\n",
    "trailers": "2\r\nok\r\n0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n",
    "bare-lf": "3\nabc\n0\n\n",
    "uppercase-hex": "A\r\n0123456789\r\n0\r\n\r\n",
    "leading-zeros": "0005\r\nhello\r\n000\r\n\r\n",
    "cut-data": "5\r\nhel",
    "cut-size": "5",
    "missing-crlf": "3\r\nabcXY",
    "bad-size": "zz\r\n",
    "empty-size": "\r\n",
    "too-many-digits": "11111111111111111\r\n",
    "max-size": "ffffffffffffffff\r\nabc",
    "space-after-size": "3  \r\nabc\r\n0\r\n\r\n",
    "junk-after-size": "3 x\r\nabc\r\n0\r\n\r\n",
    "cr-only": "3\rabc\r\n",
    "zero-only": "0\r\n\r\n",
    "long-extension": "1;" + "x" * 5000 + "\r\nz\r\n0\r\n\r\n",
}

REQUESTS = {
    "length": 'POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{"model":"llama"}',
    "chunked": "POST /v1/completions HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
    "cl-te": "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "te-cl": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    "dup-length": "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "same-length-list": "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello",
    "same-length-lines": "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    "obs-fold": "POST / HTTP/1.1\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    "bare-lf": "POST / HTTP/1.1\nContent-Length: 5\n\nhello",
    "bare-lf-chunk": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
    "control-in-extension": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a\x01\r\nhello\r\n0\r\n\r\n",
    "gzip-chunked": "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "chunked-not-last": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "te-http10": "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two-hosts": "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "pipelined": "GET /v1/models HTTP/1.1\r\nHost: p\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\n",
    "chunk-overflow": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
    "cut-body": "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort",
    "expect": "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
    "absolute-form": "GET http://a.example/v1/models HTTP/1.1\r\nHost: a.example\r\n\r\n",
    "empty-line-first": "\r\nGET / HTTP/1.1\r\n\r\n",
    "obs-text": "GET / HTTP/1.1\r\nX-Name: caf\xe9\r\n\r\n",
}


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("latin-1") if any(0x80 <= ord(c) <= 0xff for c in data) and all(ord(c) < 0x100 for c in data) else data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    for t in ["keys", "body", "resolve", "models_file", "kube_translate", "h1_head", "h1_chunked", "h1_request"]:
        shutil.rmtree(os.path.join(ROOT, t), ignore_errors=True)
    for name, body in BODIES.items():
        write("body", name + ".json", body)
    for h, b in KEY_SEEDS:
        write("keys", f"{h}--{b}", "".join(l + "\n" for l in KEY_HEADERS[h]) + "\n" + BODIES[b])
    for name, (uri, headers) in RESOLVE.items():
        write("resolve", name, uri + "\n" + "".join(l + "\n" for l in headers))
    for name, text in MODELS_FILES.items():
        write("models_file", name + ".yaml", text)
    for name, obj in KUBE.items():
        write("kube_translate", name + ".json", json.dumps(obj, indent=1))
    for name, text in RESPONSES.items():
        write("h1_head", name, text)
    for name, text in CHUNKED.items():
        write("h1_chunked", name, text)
    for name, text in REQUESTS.items():
        write("h1_request", name, text)


if __name__ == "__main__":
    main()
