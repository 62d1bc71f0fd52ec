//! Prompt rendering: the text a model server would tokenize for a request.
//!
//! Prefix caching only pays when requests that share a system prompt and document render to the
//! same leading text, so the rendering is canonical and follows a chat template's order: system
//! messages, then the request's document context, then the rest of the conversation. Anything the
//! template would not show (ids, sampling knobs, `model`) stays out.

use serde_json::Value;

/// Body fields whose text is document context, in the order they are rendered.
pub const DOCUMENT_FIELDS: [&str; 3] = ["document_context", "documentContext", "context"];

/// Why a request body has no renderable prompt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    #[error("'messages' must be a non-empty array of messages")]
    NoMessages,
    #[error("'prompt' must be a string or an array of strings or token ids")]
    NoPrompt,
    #[error("'input' must be a string or an array of strings or token ids")]
    NoInput,
}

/// Text of a message's `content`: a string, or the `text` parts of an array joined by newlines.
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => o.get("text").and_then(Value::as_str),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Every document text in the body: the [`DOCUMENT_FIELDS`] strings, then each `documents[]`
/// entry (a string, or an object's `text` or `content`).
pub fn documents(body: &Value) -> Vec<String> {
    let fields = DOCUMENT_FIELDS
        .iter()
        .filter_map(|f| body.get(f))
        .map(content_text);
    let listed = body
        .get("documents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|d| match d {
            Value::Object(o) => o
                .get("text")
                .or_else(|| o.get("content"))
                .map(content_text)
                .unwrap_or_default(),
            other => content_text(other),
        });
    fields.chain(listed).filter(|d| !d.is_empty()).collect()
}

fn role(message: &Value) -> &str {
    message
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("user")
}

fn push_turn(out: &mut String, role: &str, text: &str) {
    out.push_str("<|");
    out.push_str(role);
    out.push_str("|>\n");
    out.push_str(text);
    out.push_str("<|end|>\n");
}

/// Render a chat request: leading system messages, documents, the other messages, then the
/// assistant's turn marker.
pub fn render_chat(body: &Value) -> Result<String, PromptError> {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or(PromptError::NoMessages)?;
    let leading_system = messages.iter().take_while(|m| role(m) == "system").count();
    let mut out = String::new();
    for m in &messages[..leading_system] {
        push_turn(&mut out, "system", &content_text(&m["content"]));
    }
    for doc in documents(body) {
        push_turn(&mut out, "document", &doc);
    }
    for m in &messages[leading_system..] {
        push_turn(&mut out, role(m), &content_text(&m["content"]));
    }
    out.push_str("<|assistant|>\n");
    Ok(out)
}

/// One text per input: a string, an array of strings, or token ids (rendered as words).
fn texts(value: Option<&Value>) -> Option<Vec<String>> {
    let ids = |v: &[Value]| -> Option<String> {
        let words: Option<Vec<String>> = v
            .iter()
            .map(|t| t.as_u64().map(|n| format!(" t{n}")))
            .collect();
        words.map(|w| w.concat())
    };
    match value? {
        Value::String(s) => Some(vec![s.clone()]),
        Value::Array(items) if items.iter().all(Value::is_string) => Some(
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        ),
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|i| i.as_array().and_then(|a| ids(a)))
            .collect(),
        Value::Array(items) => ids(items).map(|t| vec![t]),
        _ => None,
    }
}

/// Render a completions request: its `prompt`; an array of prompts is joined by newlines into one.
pub fn render_completion(body: &Value) -> Result<String, PromptError> {
    texts(body.get("prompt"))
        .map(|t| t.join("\n"))
        .ok_or(PromptError::NoPrompt)
}

/// The texts of an embeddings request's `input`.
pub fn embedding_inputs(body: &Value) -> Result<Vec<String>, PromptError> {
    texts(body.get("input")).ok_or(PromptError::NoInput)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn string_and_text_parts_render_the_same() {
        let plain = json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"}
        ]});
        let parts = json!({"messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
        ]});
        let rendered = render_chat(&plain).unwrap();
        assert_eq!(rendered, render_chat(&parts).unwrap());
        assert_eq!(
            rendered,
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
        );
    }

    #[test]
    fn parts_join_by_newline_and_skip_non_text() {
        let content = json!([
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "b"}
        ]);
        assert_eq!(content_text(&content), "a\nb");
        assert_eq!(content_text(&Value::Null), "");
    }

    #[test]
    fn documents_follow_the_system_messages() {
        let body = json!({
            "model": "/models",
            "messages": [
                {"role": "system", "content": "Use the document."},
                {"role": "user", "content": "Summarize"}
            ],
            "document_context": "Doc A",
            "documents": [{"text": "Doc B"}, "Doc C", {"content": [{"type": "text", "text": "Doc D"}]}]
        });
        assert_eq!(
            render_chat(&body).unwrap(),
            "<|system|>\nUse the document.<|end|>\n\
             <|document|>\nDoc A<|end|>\n<|document|>\nDoc B<|end|>\n\
             <|document|>\nDoc C<|end|>\n<|document|>\nDoc D<|end|>\n\
             <|user|>\nSummarize<|end|>\n<|assistant|>\n"
        );
    }

    #[test]
    fn each_document_field_counts() {
        for field in DOCUMENT_FIELDS {
            let body = json!({"messages": [{"role": "user", "content": "q"}], field: "D"});
            assert_eq!(
                render_chat(&body).unwrap(),
                "<|document|>\nD<|end|>\n<|user|>\nq<|end|>\n<|assistant|>\n",
                "{field}"
            );
        }
    }

    #[test]
    fn shared_system_and_document_make_a_shared_prefix() {
        let req = |q: &str| {
            json!({"messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": q}
            ], "documentContext": "D"})
        };
        let a = render_chat(&req("first")).unwrap();
        let b = render_chat(&req("second")).unwrap();
        let shared = "<|system|>\nS<|end|>\n<|document|>\nD<|end|>\n<|user|>\n";
        assert!(a.starts_with(shared) && b.starts_with(shared));
    }

    #[test]
    fn chat_without_messages_is_an_error() {
        assert_eq!(render_chat(&json!({})), Err(PromptError::NoMessages));
        assert_eq!(
            render_chat(&json!({"messages": []})),
            Err(PromptError::NoMessages)
        );
    }

    #[test]
    fn completion_prompts() {
        assert_eq!(render_completion(&json!({"prompt": "abc"})).unwrap(), "abc");
        assert_eq!(
            render_completion(&json!({"prompt": ["a", "b"]})).unwrap(),
            "a\nb"
        );
        assert_eq!(
            render_completion(&json!({"prompt": [1, 2]})).unwrap(),
            " t1 t2"
        );
        assert_eq!(
            render_completion(&json!({"prompt": 5})),
            Err(PromptError::NoPrompt)
        );
        assert_eq!(
            embedding_inputs(&json!({"input": [[1], [2, 3]]})).unwrap(),
            [" t1", " t2 t3"]
        );
    }
}
