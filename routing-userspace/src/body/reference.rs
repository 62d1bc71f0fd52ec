//! The reference reading of a request body: typed `serde_json` structs with raw values, as the
//! proxy read bodies before the scanner. The differential tests hold [`super::BodyFields`] to
//! exactly these answers.

use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Debug, Default, Deserialize)]
pub(super) struct RefFields<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    session_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_key: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "cacheKey")]
    cache_key_camel: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prefix: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    document_context: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "documentContext")]
    document_context_camel: Option<&'a RawValue>,
    #[serde(borrow, default)]
    context: Option<&'a RawValue>,
    #[serde(borrow, default)]
    documents: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    /// `messages`, parsed on first use (key extraction may ask several times).
    #[serde(skip)]
    parsed_messages: std::sync::OnceLock<Vec<Message<'a>>>,
}

/// One chat message, with its content kept raw (a string or an array of parts).
#[derive(Debug, Deserialize)]
struct Message<'a> {
    #[serde(default)]
    role: Option<String>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
}

fn as_string(raw: Option<&RawValue>) -> Option<String> {
    serde_json::from_str::<String>(raw?.get()).ok()
}

/// Text of a message content: a plain string, or the text parts of an array joined by spaces.
fn content_text(raw: &RawValue) -> Option<String> {
    let s = raw.get();
    match s.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(s).ok(),
        Some(b'[') => {
            let parts: Vec<Part> = serde_json::from_str(s).ok()?;
            let texts: Vec<String> = parts
                .into_iter()
                .filter(|p| {
                    p.kind
                        .as_deref()
                        .is_none_or(|k| k == "text" || k == "input_text")
                })
                .filter_map(|p| p.text)
                .collect();
            (!texts.is_empty()).then(|| texts.join(" "))
        }
        _ => None,
    }
}

impl<'a> RefFields<'a> {
    /// `None` when the body is not a JSON object.
    pub(super) fn parse(body: &'a [u8]) -> Option<Self> {
        // serde would also accept a JSON array for a struct; only an object is a request body.
        let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
        if *first != b'{' {
            return None;
        }
        serde_json::from_slice(body).ok()
    }

    pub(super) fn model(&self) -> Option<String> {
        as_string(self.model)
    }

    /// The byte range of the top-level `model` value inside `body` (the slice this view was
    /// parsed from), so it can be replaced without touching any other byte.
    pub(super) fn model_span(&self, body: &[u8]) -> Option<std::ops::Range<usize>> {
        let raw = self.model?.get().as_bytes();
        let start = (raw.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
        let end = start + raw.len();
        (end <= body.len()).then_some(start..end)
    }

    pub(super) fn session_id(&self) -> Option<String> {
        as_string(self.session_id)
    }

    pub(super) fn cache_key(&self) -> Option<String> {
        as_string(self.cache_key)
    }

    pub(super) fn cache_key_camel(&self) -> Option<String> {
        as_string(self.cache_key_camel)
    }

    pub(super) fn prefix(&self) -> Option<String> {
        as_string(self.prefix)
    }

    fn messages(&self) -> &[Message<'a>] {
        self.parsed_messages.get_or_init(|| {
            self.messages
                .and_then(|m| serde_json::from_str(m.get()).ok())
                .unwrap_or_default()
        })
    }

    /// Whether the body carries a `messages` array (a chat request).
    pub(super) fn has_messages(&self) -> bool {
        !self.messages().is_empty()
    }

    /// The text of every `role: "system"` message, in order (`developer` counts as system).
    pub(super) fn system_texts(&self) -> Vec<String> {
        self.messages()
            .iter()
            .filter(|m| matches!(m.role.as_deref(), Some("system" | "developer")))
            .filter_map(|m| m.content.and_then(content_text))
            .collect()
    }

    /// The text of the first `role: "user"` message.
    pub(super) fn first_user_text(&self) -> Option<String> {
        self.messages()
            .iter()
            .find(|m| m.role.as_deref() == Some("user"))
            .and_then(|m| m.content.and_then(content_text))
    }

    /// Document context: `document_context`, `documentContext`, `context`, or the text of the
    /// first entry of `documents[]` (a string, or an object's `text` / `content`), in that order.
    pub(super) fn document_context(&self) -> Option<String> {
        let direct = [
            self.document_context,
            self.document_context_camel,
            self.context,
        ]
        .into_iter()
        .find_map(as_string);
        direct.or_else(|| {
            let docs: Vec<&RawValue> = serde_json::from_str(self.documents?.get()).ok()?;
            let first = docs.first()?;
            if let Some(s) = as_string(Some(first)) {
                return Some(s);
            }
            #[derive(Deserialize)]
            struct Doc {
                text: Option<String>,
                content: Option<String>,
            }
            let d: Doc = serde_json::from_str(first.get()).ok()?;
            d.text.or(d.content)
        })
    }

    /// A completions `prompt`: the string, or the first string of an array.
    pub(super) fn prompt_text(&self) -> Option<String> {
        let raw = self.prompt?;
        as_string(Some(raw)).or_else(|| {
            let list: Vec<String> = serde_json::from_str(raw.get()).ok()?;
            list.into_iter().next()
        })
    }
}
