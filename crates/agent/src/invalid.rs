//! What is wrong with a request, in one sentence for its sender: the API
//! answers it as a 400 with `{"error": ...}`. Checks below the API
//! (payloads, cursors) return it so the API need not guess a status.

/// A refused request: the sentence names the field and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Invalid(pub String);
