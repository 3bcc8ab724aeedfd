//! Graphviz DOT text for the `graph.dot` files (docs/tree.md#graphs-as-graphviz-files).
//!
//! Invariants: output is deterministic (nodes, clusters and edges in the order they were
//! added; the edges between one pair of nodes merged into one); every name and label is
//! quoted and escaped, so no byte of a model can break the syntax; nothing in it makes
//! `dot` slow on graphs of thousands of nodes: no edge labels (an edge names its values in
//! its tooltip, which layout ignores), no `splines=ortho`, no `concentrate`, no `compound`.

use std::collections::HashMap;
use std::fmt::Write;

/// Values an edge's tooltip names before it says how many more it carries.
const EDGE_VALUES_SHOWN: usize = 8;

/// How a node is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// An operator or kernel call.
    Op,
    /// A call into a delegate (drawn inside its cluster).
    Delegate,
    /// A constant tensor (weights, biases, scales).
    Constant,
    /// A graph or method input.
    Input,
    /// A graph or method output.
    Output,
    /// A control instruction (jump, move, free).
    Control,
}

impl Style {
    fn attrs(self) -> &'static str {
        match self {
            Style::Op => r##"shape=box, style="rounded,filled", fillcolor="#eceff1""##,
            Style::Delegate => {
                r##"shape=box3d, style="filled", fillcolor="#ffe0b2", penwidth=1.5"##
            }
            Style::Constant => r##"shape=note, style="filled", fillcolor="#fff9c4""##,
            Style::Input => {
                r##"shape=invhouse, style="filled,bold", fillcolor="#bbdefb", color="#0d47a1""##
            }
            Style::Output => {
                r##"shape=house, style="filled,bold", fillcolor="#c8e6c9", color="#1b5e20""##
            }
            Style::Control => r##"shape=diamond, style="filled", fillcolor="#f3e5f5""##,
        }
    }
}

/// A DOT string literal: `"` and `\` escaped, line breaks as `\n` (centred lines), other
/// control characters as spaces.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A directed graph being written: nodes and clusters go straight to the text, edges are
/// gathered (and merged per pair) and written last.
pub struct DotGraph {
    body: String,
    edges: Vec<(String, String, Vec<String>)>,
    edge_index: HashMap<(String, String), usize>,
    /// Depth of the cluster being written (0 at the top level).
    depth: usize,
}

impl DotGraph {
    /// A graph whose title (drawn at the top) is `label`.
    pub fn new(label: &str) -> DotGraph {
        let mut body = String::new();
        body.push_str("digraph ptefs {\n");
        let _ = writeln!(
            body,
            "  graph [label={}, labelloc=t, fontsize=14, rankdir=TB, nodesep=0.25, ranksep=0.35];",
            quote(label)
        );
        body.push_str("  node [fontsize=10, margin=\"0.08,0.04\"];\n");
        body.push_str("  edge [color=\"#546e7a\", arrowsize=0.6];\n");
        DotGraph {
            body,
            edges: Vec::new(),
            edge_index: HashMap::new(),
            depth: 0,
        }
    }

    fn indent(&mut self) {
        for _ in 0..=self.depth {
            self.body.push_str("  ");
        }
    }

    /// A node `id` (unique in the graph) drawn with `style`; `tooltip` shows on hover in
    /// SVG viewers.
    pub fn node(&mut self, id: &str, label: &str, style: Style, tooltip: Option<&str>) {
        self.indent();
        let _ = write!(
            self.body,
            "{} [label={}, {}",
            quote(id),
            quote(label),
            style.attrs()
        );
        if let Some(t) = tooltip {
            let _ = write!(self.body, ", tooltip={}", quote(t));
        }
        self.body.push_str("];\n");
    }

    /// A cluster (a framed group of nodes) titled `label`; `fill` writes its nodes.
    pub fn cluster(&mut self, id: &str, label: &str, fill: impl FnOnce(&mut DotGraph)) {
        self.indent();
        let _ = writeln!(self.body, "subgraph {} {{", quote(&format!("cluster_{id}")));
        self.depth += 1;
        self.indent();
        let _ = writeln!(
            self.body,
            "graph [label={}, style=\"rounded,filled\", fillcolor=\"#fff8e1\", color=\"#e65100\", fontsize=11];",
            quote(label)
        );
        fill(self);
        self.depth -= 1;
        self.indent();
        self.body.push_str("}\n");
    }

    /// An edge from node `from` to node `to` carrying `value`; edges of one pair merge.
    pub fn edge(&mut self, from: &str, to: &str, value: &str) {
        let key = (from.to_string(), to.to_string());
        match self.edge_index.get(&key) {
            Some(&i) => self.edges[i].2.push(value.to_string()),
            None => {
                self.edge_index.insert(key, self.edges.len());
                self.edges
                    .push((from.to_string(), to.to_string(), vec![value.to_string()]));
            }
        }
    }

    /// The whole text, ending in a newline.
    pub fn finish(mut self) -> String {
        for (from, to, values) in &self.edges {
            let mut tip = values
                .iter()
                .take(EDGE_VALUES_SHOWN)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            if values.len() > EDGE_VALUES_SHOWN {
                let _ = write!(tip, " (+{} more)", values.len() - EDGE_VALUES_SHOWN);
            }
            let _ = writeln!(
                self.body,
                "  {} -> {} [tooltip={}];",
                quote(from),
                quote(to),
                quote(&tip)
            );
        }
        self.body.push_str("}\n");
        self.body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_anything() {
        assert_eq!(quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd \"");
    }

    #[test]
    fn merges_edges_of_a_pair_in_order() {
        let mut g = DotGraph::new("t");
        g.node("a", "A", Style::Input, None);
        g.cluster("d0", "delegate", |g| {
            g.node("b", "B", Style::Delegate, Some("tip"))
        });
        g.edge("a", "b", "%1");
        g.edge("b", "a", "%2");
        g.edge("a", "b", "%3");
        let text = g.finish();
        assert!(text.contains("\"a\" -> \"b\" [tooltip=\"%1, %3\"];\n  \"b\" -> \"a\""));
        assert!(text.contains("subgraph \"cluster_d0\" {"));
        assert!(text.ends_with("}\n"));
    }
}
