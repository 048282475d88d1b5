//! Charts as inline SVG built on the server from numbers only (no text from
//! the database goes into them unescaped).

use maud::{html, Markup};

/// A horizontal bar of `width` pixels: `part` of `whole` filled, and
/// `inner` of it (in flight, say) in a darker shade.
pub(crate) fn bar(part: i64, inner: i64, whole: i64, width: u32) -> Markup {
    let scale = |n: i64| {
        if whole <= 0 {
            0.0
        } else {
            (n.clamp(0, whole) as f64 / whole as f64) * f64::from(width)
        }
    };
    let (w, wi) = (scale(part), scale(inner.min(part)));
    html! {
        svg width=(width) height="10" role="img" aria-label="depth" {
            rect x="0" y="0" width=(width) height="10" fill="#eef" {}
            rect x="0" y="0" width=(format!("{w:.1}")) height="10" fill="#7b8fd6" {}
            rect x="0" y="0" width=(format!("{wi:.1}")) height="10" fill="#2f3f8f" {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_never_overflows() {
        let s = bar(500, 10, 100, 120).into_string();
        assert!(s.contains("width=\"120.0\""));
        let s = bar(1, 0, 0, 120).into_string();
        assert!(s.contains("width=\"0.0\""));
    }
}
