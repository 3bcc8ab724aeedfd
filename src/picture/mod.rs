//! Pictures of a model, as pure functions of what they show (docs/tree.md#pictures): Graphviz
//! text for graphs (`dot`), statistics of values (`stats`) and the SVG of their histogram
//! (`hist`), the SVG treemap of where bytes go (`treemap`).
//!
//! Nothing here reads a model: callers pass what to draw, so the same drawing serves a plan,
//! a backend payload or any source of numbers. Every picture is deterministic.

pub mod dot;
pub mod hist;
pub mod stats;
pub mod treemap;
