//! Continuing a sender's trace (feature `otel`): a message whose headers
//! carry a W3C trace context (`traceparent`, `tracestate`, put there by a
//! client built with `ClientBuilder::trace_context`) gets it as the parent
//! of its `pgmq_worker.handle` span, read through OpenTelemetry's global
//! propagator. That span is then at INFO rather than DEBUG: the sender
//! asked for this message to be traced.

use serde_json::Value;

/// The sender's context in `headers`, if they carry a valid one.
pub(crate) fn sender_context(headers: Option<&Value>) -> Option<opentelemetry::Context> {
    use opentelemetry::trace::TraceContextExt;
    struct In<'a>(&'a serde_json::Map<String, Value>);
    impl opentelemetry::propagation::Extractor for In<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key)?.as_str()
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(String::as_str).collect()
        }
    }
    let Some(Value::Object(h)) = headers else {
        return None;
    };
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&In(h)));
    cx.span().span_context().is_valid().then_some(cx)
}

/// Makes `cx` the parent of `span`.
pub(crate) fn continue_in(span: &tracing::Span, cx: opentelemetry::Context) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let _ = span.set_parent(cx);
}
