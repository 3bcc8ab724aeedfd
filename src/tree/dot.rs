//! `plans/<name>/graph.dot`: a plan's instructions as a Graphviz graph
//! (docs/tree.md#graphs-as-graphviz-files).
//!
//! Instructions are nodes in chain order; tensors are edges from the instruction that
//! writes them to each instruction that reads them. ExecuTorch does not say which arguments
//! of a kernel are outputs, so a tensor's first instruction is taken as its writer, unless it
//! is an input of the method or has bytes in the files (constants, initial states, external
//! tensors), which are nodes of their own, drawn where first read. A delegate call is a
//! cluster naming its backend, whose node summarizes the payload's operators (its own graph
//! is `delegates/<j>/<backend>/graph.dot`). Method inputs and outputs are highlighted nodes;
//! scalars and lists of numbers are not drawn.
//!
//! Invariants: output depends only on the plan (no hash map is iterated); the graph has one
//! node per instruction, input, output and drawn constant, so `dot` lays out a plan of
//! thousands of instructions without the attributes that make it slow (`picture::dot`).

use std::collections::HashMap;
use std::fmt::{self, Write};

use super::render::{kernel_operator, plan};
use super::Tree;
use crate::format::generated::pte_fb;
use crate::format::layout::DataKind;
use crate::format::scalar_type;
use crate::picture::dot::{DotGraph, Style};

/// Operators a delegate's node names before it says how many others its payload has.
const OPS_SHOWN: usize = 4;

/// `%<i> FLOAT[2,4]`, `%<i> Int 3`, `%<i> IntList`: a value as a label line.
fn describe(values: &[pte_fb::EValueT], i: usize) -> String {
    use pte_fb::KernelTypesT as K;
    match values.get(i).map(|v| &v.val) {
        Some(K::Tensor(t)) => {
            let sizes: Vec<String> = t.sizes.iter().flatten().map(i32::to_string).collect();
            let name = t
                .extra_tensor_info
                .as_ref()
                .and_then(|e| e.fully_qualified_name.as_deref())
                .map_or_else(String::new, |n| format!(" {n}"));
            format!(
                "%{i}{name} {}[{}]",
                scalar_type::display(t.scalar_type.0),
                sizes.join(",")
            )
        }
        Some(K::Int(x)) => format!("%{i} Int {}", x.int_val),
        Some(K::Bool(x)) => format!("%{i} Bool {}", x.bool_val),
        Some(K::Double(x)) => format!("%{i} Double {}", x.double_val),
        Some(v) => format!("%{i} {}", super::render::kernel_type_name(v)),
        None => format!("%{i} (out of range)"),
    }
}

/// The tensors value `i` stands for in a call: itself, or the members of a tensor list.
fn tensors(values: &[pte_fb::EValueT], i: i64) -> Vec<usize> {
    use pte_fb::KernelTypesT as K;
    let Some(v) = usize::try_from(i).ok().and_then(|i| values.get(i)) else {
        return Vec::new();
    };
    let is_tensor = |j: &i32| {
        usize::try_from(*j)
            .ok()
            .filter(|&j| matches!(values.get(j).map(|v| &v.val), Some(K::Tensor(_))))
    };
    match &v.val {
        K::Tensor(_) => vec![i as usize],
        K::TensorList(l) => l.items.iter().flatten().filter_map(is_tensor).collect(),
        K::OptionalTensorList(l) => l.items.iter().flatten().filter_map(is_tensor).collect(),
        _ => Vec::new(),
    }
}

/// What a delegate call's node says of its payload: its operators by count.
fn delegate_summary(tree: &Tree, p: usize, j: usize) -> String {
    let Some(dec) = tree.catalog.payloads.get(p, j) else {
        return "payload not decoded".to_string();
    };
    let ops = dec.payload.op_names();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for op in &ops {
        match counts.iter_mut().find(|(o, _)| o == op) {
            Some((_, n)) => *n += 1,
            None => counts.push((op.clone(), 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut lines = vec![format!("{} operators", ops.len())];
    for (op, n) in counts.iter().take(OPS_SHOWN) {
        lines.push(format!("{op} ×{n}"));
    }
    if counts.len() > OPS_SHOWN {
        lines.push(format!("{} more kinds", counts.len() - OPS_SHOWN));
    }
    lines.join("\n")
}

/// Which node each tensor of a plan comes from.
struct Flow<'a> {
    values: &'a [pte_fb::EValueT],
    layout: &'a crate::format::layout::PlanLayout,
    source: HashMap<usize, String>,
}

impl Flow<'_> {
    /// The node tensor `t` comes from; a tensor with bytes in the files gets its own node
    /// when first asked for.
    fn source_of(&mut self, g: &mut DotGraph, t: usize) -> Option<String> {
        if let Some(s) = self.source.get(&t) {
            return Some(s.clone());
        }
        let data = self.layout.tensors.get(t).and_then(Option::as_ref)?;
        if data.kind == DataKind::None {
            return None;
        }
        let id = format!("v{t}");
        g.node(
            &id,
            &format!("{}\n{}", describe(self.values, t), data.kind.as_str()),
            Style::Constant,
            None,
        );
        self.source.insert(t, id.clone());
        Some(id)
    }

    /// Edges into node `id` from the sources of the tensors of `args`; a tensor without
    /// one is written by `id` (added to `written`, which the caller records after).
    fn reads(
        &mut self, g: &mut DotGraph, id: &str, args: &[i64], written: &mut Vec<(usize, String)>,
    ) {
        for &a in args {
            for t in tensors(self.values, a) {
                if written.iter().any(|(w, _)| *w == t) {
                    continue;
                }
                match self.source_of(g, t) {
                    Some(from) if from != id => g.edge(&from, id, &describe(self.values, t)),
                    Some(_) => {}
                    None => written.push((t, id.to_string())),
                }
            }
        }
    }
}

/// Writes `plans/<name>/graph.dot` of plan `p`.
pub fn plan_dot(tree: &Tree, p: usize, out: &mut dyn Write) -> fmt::Result {
    use pte_fb::InstructionArgumentsT as A;
    let model = &*tree.model;
    let plan = plan(model, p);
    let layout = &model.pte_layout.as_ref().expect("a resolved .pte").plans[p];
    let values = plan.values.as_deref().unwrap_or_default();
    let operators = plan.operators.as_deref().unwrap_or_default();
    let delegates = plan.delegates.as_deref().unwrap_or_default();
    let name = &tree.catalog.names.plans[p];
    let mut g = DotGraph::new(&format!(
        "plans/{name}: {} instructions, {} values",
        crate::format::pte::instruction_count(plan),
        values.len()
    ));
    let mut flow = Flow {
        values,
        layout,
        source: HashMap::new(),
    };
    for (k, &i) in plan.inputs.iter().flatten().enumerate() {
        let id = format!("in{k}");
        g.node(
            &id,
            &format!("input {k}\n{}", describe(values, i as usize)),
            Style::Input,
            None,
        );
        for t in tensors(values, i.into()) {
            flow.source.insert(t, id.clone());
        }
    }
    for (c, chain) in plan.chains.iter().flatten().enumerate() {
        for (pc, ins) in chain.instructions.iter().flatten().enumerate() {
            let id = format!("i{c}_{pc}");
            let mut written = Vec::new();
            match &ins.instr_args {
                A::KernelCall(k) => {
                    let op = kernel_operator(operators, k.op_index);
                    g.node(&id, &format!("{c}:{pc} {op}"), Style::Op, None);
                    let args: Vec<i64> = k.args.iter().flatten().map(|&a| a.into()).collect();
                    flow.reads(&mut g, &id, &args, &mut written);
                }
                A::DelegateCall(d) => {
                    let j = usize::try_from(d.delegate_index).ok();
                    let backend_id = j
                        .and_then(|j| delegates.get(j))
                        .and_then(|d| d.id.clone())
                        .unwrap_or_else(|| "<out of range>".to_string());
                    let decoded = j.and_then(|j| tree.catalog.payloads.get(p, j));
                    let (backend, dir) = decoded.map_or(("not decoded", ""), |dec| {
                        let b = dec.payload.backend();
                        (b.display_name(), b.dir_name())
                    });
                    let summary = j.map_or_else(String::new, |j| delegate_summary(tree, p, j));
                    let tip = match (j, decoded) {
                        (Some(j), Some(_)) => format!("delegates/{j}/{dir}/graph.dot"),
                        _ => String::new(),
                    };
                    let label = format!("delegate {}: {backend_id} ({backend})", d.delegate_index);
                    g.cluster(&id, &label, |g| {
                        g.node(
                            &id,
                            &format!("{c}:{pc} delegate {}\n{summary}", d.delegate_index),
                            Style::Delegate,
                            (!tip.is_empty()).then_some(tip.as_str()),
                        );
                    });
                    let args: Vec<i64> = d.args.iter().flatten().map(|&a| a.into()).collect();
                    flow.reads(&mut g, &id, &args, &mut written);
                }
                A::MoveCall(m) => {
                    g.node(&id, &format!("{c}:{pc} move"), Style::Control, None);
                    flow.reads(&mut g, &id, &[m.move_from.into()], &mut written);
                    for t in tensors(values, m.move_to.into()) {
                        written.push((t, id.clone()));
                    }
                }
                A::JumpFalseCall(jf) => {
                    g.node(
                        &id,
                        &format!("{c}:{pc} jump_false -> {c}:{}", jf.destination_instruction),
                        Style::Control,
                        None,
                    );
                    flow.reads(&mut g, &id, &[jf.cond_value_index.into()], &mut written);
                }
                A::FreeCall(_) | A::NONE => continue,
            }
            for (t, w) in written {
                flow.source.insert(t, w);
            }
        }
    }
    for (k, &o) in plan.outputs.iter().flatten().enumerate() {
        let id = format!("out{k}");
        g.node(
            &id,
            &format!("output {k}\n{}", describe(values, o as usize)),
            Style::Output,
            None,
        );
        for t in tensors(values, o.into()) {
            if let Some(from) = flow.source_of(&mut g, t) {
                g.edge(&from, &id, &describe(values, t));
            }
        }
    }
    out.write_str(&g.finish())
}
