//! Trace context in message headers (feature `otel`): a client built with
//! [`ClientBuilder::trace_context`](crate::ClientBuilder::trace_context)
//! puts the current OpenTelemetry context into every message it sends, as
//! the W3C `traceparent` (and `tracestate`) headers, through the globally
//! installed propagator (`opentelemetry::global::set_text_map_propagator`,
//! usually `TraceContextPropagator`). The current context is that of the
//! current `tracing` span, through `tracing-opentelemetry`.
//!
//! The context sent is that of the send's own span (`pgmq.send`, ...),
//! whose parent is the caller's span; a send's span without a parent (the
//! caller is in no span) sends nothing.
//!
//! The keys are merged into the caller's headers (a caller's own key of
//! the same name is kept); a message without headers gets an object of
//! only these. Without an active trace (no span, or no OpenTelemetry layer)
//! or a propagator, nothing is added. Headers that are not a JSON object
//! are left as they are.

use serde_json::{Map, Value};

/// The trace headers of the current span's context (empty without one).
#[cfg(feature = "otel")]
pub(crate) fn current() -> Map<String, Value> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    struct Out<'a>(&'a mut Map<String, Value>);
    impl opentelemetry::propagation::Injector for Out<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key.to_owned(), Value::String(value));
        }
    }
    let span = tracing::Span::current();
    if is_root(&span) {
        // The send's own span opened a trace of its own: the caller has none.
        return Map::new();
    }
    let cx = span.context();
    let mut map = Map::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut Out(&mut map)));
    map
}

/// Whether `span` (a send's own span) has no parent span, so that its
/// context is a trace it started rather than the caller's. Unknown (not on
/// the `tracing-subscriber` registry): not a root.
#[cfg(feature = "otel")]
fn is_root(span: &tracing::Span) -> bool {
    use tracing_subscriber::registry::LookupSpan;
    let Some(id) = span.id() else {
        return true;
    };
    tracing::dispatcher::get_default(|d| {
        d.downcast_ref::<tracing_subscriber::Registry>()
            .and_then(|r| r.span(&id))
            .is_some_and(|s| s.parent().is_none())
    })
}

/// Without the feature there is never a trace context to send.
#[cfg(not(feature = "otel"))]
pub(crate) fn current() -> Map<String, Value> {
    Map::new()
}

/// `headers` with `trace` merged in (the caller's keys win).
pub(crate) fn merged(headers: Option<&Value>, trace: &Map<String, Value>) -> Option<Value> {
    if trace.is_empty() {
        return headers.cloned();
    }
    match headers {
        None => Some(Value::Object(trace.clone())),
        Some(Value::Object(own)) => {
            let mut all = trace.clone();
            all.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
            Some(Value::Object(all))
        }
        Some(other) => Some(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trace() -> Map<String, Value> {
        let Value::Object(m) = json!({"traceparent": "00-aa-bb-01"}) else {
            unreachable!()
        };
        m
    }

    #[test]
    fn trace_keys_merge_into_the_callers_headers_which_win() {
        let own = json!({"tenant": "a", "traceparent": "mine"});
        assert_eq!(
            merged(Some(&own), &trace()),
            Some(json!({"tenant": "a", "traceparent": "mine"}))
        );
        assert_eq!(
            merged(Some(&json!({"tenant": "a"})), &trace()),
            Some(json!({"tenant": "a", "traceparent": "00-aa-bb-01"}))
        );
        assert_eq!(
            merged(None, &trace()),
            Some(json!({"traceparent": "00-aa-bb-01"}))
        );
    }

    #[test]
    fn without_a_trace_or_with_non_object_headers_nothing_changes() {
        assert_eq!(merged(None, &Map::new()), None);
        let own = json!({"tenant": "a"});
        assert_eq!(merged(Some(&own), &Map::new()), Some(own));
        assert_eq!(merged(Some(&json!([1])), &trace()), Some(json!([1])));
    }
}
